"""Plain Temporal workflows and activities (no exactcall), as a user's existing app has them,
and one ``__slots__`` workflow that does call exactcall: tests/test_plugin_neutral.py runs them
with and without ``exactcall.Plugin()``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
)

with workflow.unsafe.imports_passed_through():
    import exactcall

MINUTE = timedelta(minutes=1)


@activity.defn
async def shout(text: str) -> str:
    return text.upper() + "!"


@workflow.defn
class Greeter:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            shout, f"hello {name}", start_to_close_timeout=MINUTE
        )


@workflow.defn
class Slotted:
    """A workflow whose instances have no ``__dict__``."""

    __slots__ = ("greeting",)

    def __init__(self) -> None:
        self.greeting = ""

    @workflow.run
    async def run(self, name: str) -> str:
        self.greeting = await workflow.execute_activity(shout, name, start_to_close_timeout=MINUTE)
        return self.greeting


@workflow.defn
class SlottedPayer:
    """A ``__slots__`` workflow that pays through exactcall."""

    __slots__ = ("receipt",)

    def __init__(self) -> None:
        self.receipt: Any = None

    @workflow.run
    async def run(self, bank: str, to: str) -> Any:
        self.receipt = await exactcall.call("pay", bank, 3, to)
        return self.receipt


@workflow.defn
class Dynamic:
    """Dynamic signal and query handlers: every name is theirs."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @workflow.run
    async def run(self) -> list[str]:
        await workflow.wait_condition(lambda: "stop" in self.seen)
        return self.seen

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self.seen.append(name)

    @workflow.query(dynamic=True)
    def any_query(self, name: str, args: Sequence[RawValue]) -> list[str]:
        return [name, *self.seen]


@activity.defn
async def sort_out(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "seen": True}


@workflow.defn
class Echo:
    """A dict through a workflow and an activity: its payload bytes are the converter's."""

    @workflow.run
    async def run(self, d: dict[str, Any]) -> dict[str, Any]:
        return await workflow.execute_activity(sort_out, d, start_to_close_timeout=MINUTE)


# -- a user's own payload converter (as Temporal's samples/custom_converter has one) -----------
class Money:
    """A user type no JSON converter knows: the custom converter carries it."""

    def __init__(self, cents: int) -> None:
        self.cents = cents

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and other.cents == self.cents

    def __hash__(self) -> int:
        return self.cents


class MoneyConverter(EncodingPayloadConverter):
    @property
    def encoding(self) -> str:
        return "binary/money"

    def to_payload(self, value: Any) -> Payload | None:
        if not isinstance(value, Money):
            return None
        return Payload(
            metadata={"encoding": self.encoding.encode()}, data=str(value.cents).encode()
        )

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        return Money(int(payload.data.decode()))


class WithMoney(CompositePayloadConverter):
    def __init__(self) -> None:
        super().__init__(
            MoneyConverter(), *DefaultPayloadConverter.default_encoding_payload_converters
        )


MONEY = DataConverter(payload_converter_class=WithMoney)


@activity.defn
async def double(m: Money) -> Money:
    return Money(m.cents * 2)


@workflow.defn
class Till:
    @workflow.run
    async def run(self, m: Money) -> Money:
        return await workflow.execute_activity(double, m, start_to_close_timeout=MINUTE)
