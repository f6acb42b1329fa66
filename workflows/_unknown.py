"""Agent side of an unknown outcome: start (or join) the call's reconciliation and wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError, WorkflowAlreadyStartedError, is_cancelled_exception
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

from exactcall._errors import AmbiguousOutcome, ToolFailed
from exactcall._model import Intent
from exactcall._tool import Tool
from exactcall._wire import AWAIT_SETTLED as AWAIT_SETTLED
from exactcall._wire import CANCELLED_MEMO as CANCELLED_MEMO
from exactcall._wire import CANCELLED_SIGNAL as CANCELLED_SIGNAL
from exactcall._wire import CANCELLED_WHILE_JOINING as CANCELLED_WHILE_JOINING
from exactcall._wire import JOIN_CANCELLED_BEFORE_SENT
from exactcall._wire import JOINS_STARTED_RECONCILIATION as JOINS_STARTED_RECONCILIATION
from exactcall._wire import SETTLE_PREFIX as SETTLE_PREFIX
from exactcall._wire import SETTLED_BY_SIGNAL as SETTLED_BY_SIGNAL
from exactcall._wire import settle_activity_id as settle_activity_id
from exactcall.reconciliation._verdicts import (
    JOINED_SIGNAL,
    RECONCILE_WORKFLOW,
    SETTLED_SIGNAL,
    CallAbandoned,
    Settled,
    SettledNote,
    call_spec,
    reconcile_id,
    reconcile_input,
    reconcile_start_options,
)
from exactcall.workflows._state import state

__all__ = [
    "AWAIT_SETTLED",
    "CANCELLED_ERROR",
    "CANCELLED_MEMO",
    "CANCELLED_SIGNAL",
    "SETTLE_PREFIX",
    "OnUnknown",
    "await_verdict",
    "call_spec",
    "reconcile_input",
    "reconcile_start_options",
    "reconciling",
    "settle_activity_id",
    "settled_result",
    "start_reconciliation",
    "tell_cancelled",
]

OnUnknown = Literal["wait", "raise"]
CANCELLED_ERROR = "Cancelled"
"""``Settled.error_type`` of a cancelled call that did not land (its key is released)."""


async def start_reconciliation(
    t: Tool, intent: Intent, err: AmbiguousOutcome, *, cancelled: bool = False
) -> ChildWorkflowHandle[Any, Settled] | None:
    """Start the reconciliation of the call's key (None: it runs already, started by the
    attempt that found the outcome unknown, or by an earlier run of this workflow).

    It is a child that outlives its parent. ``cancelled``: the call's workflow cancelled it,
    so a "not landed" verdict releases the key instead of running the call once more; one
    that runs already is told so by signal.
    """
    reason = str(err.fields.get("reason") or err.message)
    inp = reconcile_input(t, intent, reason, workflow.now())
    try:
        return await workflow.start_child_workflow(
            RECONCILE_WORKFLOW,
            inp,
            parent_close_policy=ParentClosePolicy.ABANDON,
            result_type=Settled,
            **reconcile_start_options(inp, cancelled=cancelled),
        )
    except WorkflowAlreadyStartedError:
        if cancelled and workflow.patched(JOINS_STARTED_RECONCILIATION):
            await tell_cancelled(intent)
        return None


def reconciling(err: AmbiguousOutcome, intent: Intent) -> AmbiguousOutcome:
    """The AmbiguousOutcome an agent gets when it does not wait for the verdict."""
    cid = reconcile_id(intent.key)
    return AmbiguousOutcome(
        f"{err.message} Reconciliation {cid} is running; `exactcall unresolved` lists the "
        "call until it is settled.",
        **{**err.fields, "reconcile_id": cid},
    )


async def await_verdict(
    t: Tool,
    intent: Intent,
    child: ChildWorkflowHandle[Any, Settled] | None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Any:
    """Wait for the reconciliation's verdict. Cancelling the wait never cancels it.

    ``cancelled`` says whether the call has been cancelled: a cancellation that the SDK
    absorbed (it came while the join signal was in flight) ends the wait all the same.
    """
    cid = reconcile_id(intent.key)
    workflow.logger.warning("exactcall call.reconciling: %s %s (%s)", t.name, intent.step, cid)
    if child is not None:
        settled: Settled = await asyncio.shield(child)
    elif workflow.patched(SETTLED_BY_SIGNAL):
        settled = await _joined(intent, cancelled)
    else:  # histories from before SETTLED_BY_SIGNAL
        settled = await _await_settled(cid)
    return settled_result(t, intent, settled)


async def _joined(intent: Intent, cancelled: Callable[[], bool]) -> Settled:
    """Wait for the verdict of a reconciliation that is not this workflow's child: it signals
    it to the workflow of the call when it settles. If it settled already (an earlier run's),
    its result is read at once. No worker slot is held while a parked call waits for a person.
    """
    st = state()
    if workflow.get_signal_handler(SETTLED_SIGNAL) is None:

        def on_settled(note: SettledNote) -> None:
            st.settled[note.key] = note.settled

        workflow.set_signal_handler(SETTLED_SIGNAL, on_settled)
    cid = reconcile_id(intent.key)
    try:  # accepted only while it runs: then its verdict reaches this run, which is current
        await workflow.get_external_workflow_handle(cid).signal(JOINED_SIGNAL)
    except FailureError as err:
        # cancelled before the signal went out: the caller tells the reconciliation and ends
        if is_cancelled_exception(err) and workflow.patched(JOIN_CANCELLED_BEFORE_SENT):
            raise
        if intent.key not in st.settled:
            return await _await_settled(cid)  # it has closed: its result is there
    await workflow.wait_condition(lambda: intent.key in st.settled or cancelled())
    if intent.key not in st.settled:
        # cancelled while the signal was in flight: a sent signal cannot be withdrawn, so the
        # SDK let it finish and the task's cancellation was dropped; it is honoured here
        if workflow.patched(CANCELLED_WHILE_JOINING):
            raise asyncio.CancelledError()
        await workflow.wait_condition(lambda: intent.key in st.settled)
    return st.settled.pop(intent.key)


async def _await_settled(cid: str) -> Settled:
    return await workflow.execute_activity(
        AWAIT_SETTLED,
        cid,
        result_type=Settled,
        start_to_close_timeout=timedelta(days=3650),
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
    )


async def tell_cancelled(intent: Intent) -> None:
    """Tell a running reconciliation that the call's workflow cancelled the call."""
    handle = workflow.get_external_workflow_handle(reconcile_id(intent.key))
    try:
        await handle.signal(CANCELLED_SIGNAL)
    except FailureError:  # it has settled already
        workflow.logger.info("exactcall: reconciliation of %s already settled", intent.step)


def settled_result(t: Tool, intent: Intent, settled: Settled) -> Any:
    fields: dict[str, Any] = {
        "tool": t.name,
        "step": intent.step,
        "key": intent.key,
        "args_hash": intent.args_hash,
        "decided_by": settled.decided_by,
    }
    if settled.outcome == "done":
        return settled.result
    if settled.outcome == "abandoned":
        raise CallAbandoned(
            f"{t.name} {intent.step}: outcome unknown and abandoned by {settled.decided_by}"
            + (f": {settled.reason}" if settled.reason else ""),
            **fields,
        )
    if settled.error_type == CANCELLED_ERROR:
        raise ToolFailed(
            f"{t.name} {intent.step} was cancelled and did not happen (decided by "
            f"{settled.decided_by}); its key is released",
            **fields,
            error_type=settled.error_type,
        )
    raise ToolFailed(
        f"{t.name} {intent.step} was re-run after '{settled.decided_by}' said it had not "
        f"landed, and failed: {settled.reason}",
        **fields,
        error_type=settled.error_type,
    )
