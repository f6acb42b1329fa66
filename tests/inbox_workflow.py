"""A workflow whose waiting call is replaced by one with other arguments (the inbox's tests)."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall


@workflow.defn
class Replan:
    """Asks to pay ``amount`` (step ``pay``); a ``replan`` signal withdraws that call and asks
    again with the new amount, in a new run of the same workflow (same step name)."""

    def __init__(self) -> None:
        self._amount: int | None = None

    @workflow.signal
    def replan(self, amount: int) -> None:
        self._amount = amount

    @workflow.run
    async def run(self, bank: str, amount: int, to: str) -> Any:
        call = asyncio.ensure_future(exactcall.call("transfer", bank, amount, to, key="pay"))
        await workflow.wait_condition(lambda: call.done() or self._amount is not None)
        if not call.done():
            call.cancel()
            with suppress(asyncio.CancelledError):
                await call
            workflow.continue_as_new(args=[bank, self._amount, to])
        return call.result()
