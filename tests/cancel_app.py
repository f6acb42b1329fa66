"""Tools and workflows of tests/test_cancellation.py (importable by a worker process).

Every tool pays 10 at the real local bank under the call's idempotency key, and has the
bank as its reconciliation probe. ``HELD`` (accounts whose tools wait until released) is
for in-process workers, where the tools run in the test's own process.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.worker import (
    Interceptor,
    SignalExternalWorkflowInput,
    StartChildWorkflowInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo.bank_client import post_payment
    from exactcall.quickstart._common import find_payment, pay_at_bank
    from exactcall.reconciliation._verdicts import JOINED_SIGNAL

FAST = timedelta(seconds=2)
HELD: set[str] = set()
"""Accounts whose payments wait (in-process workers only): the test releases them."""
SAW_CANCEL: set[str] = set()


async def _held(to: str) -> None:
    while to in HELD:
        await asyncio.sleep(0.05)


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
async def cancel_pay_then_wait(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then waits while held; a cancellation there propagates: the outcome is unknown."""
    receipt = await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())
    await _held(to)
    return receipt


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
async def cancel_wait_then_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Waits while held, then pays. Cancelled while waiting, it knows it did not pay."""
    try:
        await _held(to)
    except asyncio.CancelledError:
        raise exactcall.NotExecuted("cancelled before paying") from None
    return await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
async def cancel_wait_then_pay_blindly(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Waits while held, then pays; lets a cancellation propagate without saying anything."""
    await _held(to)
    return await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
def cancel_sync_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A sync tool: pays, then waits while held until ``activity.is_cancelled()``."""
    headers = exactcall.idempotency_headers()
    receipt = post_payment(bank, amount, to, headers)
    while to in HELD and not activity.is_cancelled():
        time.sleep(0.05)
    return {**receipt, "saw_cancel": activity.is_cancelled()}


@exactcall.tool(read_only=True, heartbeat_timeout=FAST)
async def cancel_read_payments(bank: str, to: str) -> int:
    """Read-only: waits while held (noting in SAW_CANCEL that it was cancelled there)."""
    try:
        await _held(to)
    except asyncio.CancelledError:
        SAW_CANCEL.add(to)
        raise
    return 0


@exactcall.tool(
    heartbeat_timeout=FAST,
    reconcile=find_payment,
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=60)),
)
async def cancel_refused_first(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Its first attempt is refused (NotExecuted); the next one comes a minute later."""
    if activity.info().attempt == 1:
        raise exactcall.NotExecuted("the bank was busy")
    return await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
async def cancel_approved_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Needs a person's approval of its exact arguments."""
    return await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())


@exactcall.tool(heartbeat_timeout=FAST)
async def cancel_pay_then_fail(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then fails with a plain error: unknown, and no probe, so it is parked."""
    await pay_at_bank(bank, amount, to, key=exactcall.idempotency_key())
    raise RuntimeError("connection reset after the payment was sent")


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
async def cancel_term_pay(
    bank: str, amount: int, to: str, pay_first: bool, seconds: float
) -> dict[str, Any]:
    """For a worker sent SIGTERM: the first attempt is slow (``seconds``), paying before
    (``pay_first``, a cancellation then propagates) or after the wait (a cancellation then
    raises NotExecuted). Later attempts pay at once."""
    key = exactcall.idempotency_key()
    if activity.info().attempt > 1:
        return await pay_at_bank(bank, amount, to, key=key)
    if pay_first:
        receipt = await pay_at_bank(bank, amount, to, key=key)
        await asyncio.sleep(seconds)
        return receipt
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        raise exactcall.NotExecuted("the worker shut down before the payment") from None
    return await pay_at_bank(bank, amount, to, key=key)


@workflow.defn
class SharedKey:
    """Two callers of one key, each in a task of its own; a signal cancels the first."""

    def __init__(self) -> None:
        self._cancel_first = False

    @workflow.run
    async def run(self, tool: str, bank: str, to: str) -> dict[str, Any]:
        first = asyncio.ensure_future(exactcall.call(tool, bank, 10, to, key="shared"))
        second = asyncio.ensure_future(exactcall.call(tool, bank, 10, to, key="shared"))
        await workflow.wait_condition(lambda: self._cancel_first)
        first.cancel()
        try:
            await first
            first_out = "returned"
        except asyncio.CancelledError:
            first_out = "cancelled"
        return {"first": first_out, "second": await second}

    @workflow.signal
    def cancel_first(self) -> None:
        self._cancel_first = True


@workflow.defn
class AbandonsApproval:
    """Requests an approved call, cancels its own caller on a signal, and goes on living."""

    def __init__(self) -> None:
        self._abort = False
        self._finish = False

    @workflow.run
    async def run(self, bank: str, to: str) -> str:
        call = asyncio.ensure_future(exactcall.call("cancel_approved_pay", bank, 10, to))
        await workflow.wait_condition(lambda: self._abort)
        call.cancel()
        try:
            await call
            out = "ran"
        except asyncio.CancelledError:
            out = "cancelled"
        await workflow.wait_condition(lambda: self._finish)
        return out

    @workflow.signal
    def abort(self) -> None:
        self._abort = True

    @workflow.signal
    def finish(self) -> None:
        self._finish = True


class HoldsTheJoin(Interceptor):
    """Holds the workflow task that sends the join signal until the test lets it go, so a
    cancellation requested meanwhile is buffered by the server and written right after the
    signal is initiated: the cancellation lands while the signal is in flight, every time
    (left to timing, that window is a few milliseconds)."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        hold = self

        class Outbound(WorkflowOutboundInterceptor):
            async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
                if input.signal == JOINED_SIGNAL:
                    hold.reached.set()
                    hold.go.wait(1.5)  # under the deadlock detector's 2 s
                return await super().signal_external_workflow(input)

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound


class SeesTheChildStart(Interceptor):
    """Says when a workflow asks to start a reconciliation as its child (the test then stops
    the worker, so the start's failure and a cancellation land in one workflow task)."""

    def __init__(self) -> None:
        self.reached = threading.Event()

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        sees = self

        class Outbound(WorkflowOutboundInterceptor):
            async def start_child_workflow(self, input: StartChildWorkflowInput) -> Any:
                sees.reached.set()
                return await super().start_child_workflow(input)

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound
