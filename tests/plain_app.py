"""Plain Temporal workflows and activities (no exactcall), as a user's existing app has them,
and one ``__slots__`` workflow that does call exactcall: tests/test_plugin_neutral.py runs them
with and without ``exactcall.Plugin()``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RawValue

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
