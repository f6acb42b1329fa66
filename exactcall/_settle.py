"""Agent side of an unknown outcome: start (or join) the call's reconciliation and wait."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

from ._errors import AmbiguousOutcome, ToolFailed
from ._model import Intent
from ._reconcile import (
    RECONCILE_WORKFLOW,
    CallAbandoned,
    ReconcileInput,
    Settled,
    reconcile_id,
)
from ._tool import Tool

__all__ = ["AWAIT_SETTLED", "OnUnknown", "reconcile", "settled_result"]

OnUnknown = Literal["wait", "raise"]
AWAIT_SETTLED = "exactcall.await_settled"


async def reconcile(t: Tool, intent: Intent, err: AmbiguousOutcome, on_unknown: OnUnknown) -> Any:
    """Route an unknown outcome to the reconciliation workflow of its key."""
    cid = reconcile_id(intent.key)
    inp = ReconcileInput(
        intent=intent,
        reason=str(err.fields.get("reason") or err.message),
        since=workflow.now(),
        has_probe=t.options.reconcile is not None,
        probe_deadline=t.options.reconcile_deadline,
    )
    try:
        child = await workflow.start_child_workflow(
            RECONCILE_WORKFLOW,
            inp,
            id=cid,
            task_queue=intent.record_task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            result_type=Settled,
            static_summary=f"reconcile {intent.tool} {intent.step} of {intent.workflow_id}",
        )
    except WorkflowAlreadyStartedError:  # an earlier run of this workflow started it
        child = None
    if on_unknown == "raise":
        raise AmbiguousOutcome(
            f"{err.message} Reconciliation {cid} is running; `exactcall unresolved` lists the "
            "call until it is settled.",
            **{**err.fields, "reconcile_id": cid},
        )
    workflow.logger.warning("exactcall call.reconciling: %s %s (%s)", t.name, intent.step, cid)
    if child is not None:
        settled: Settled = await child
    else:
        settled = await workflow.execute_activity(
            AWAIT_SETTLED,
            cid,
            result_type=Settled,
            start_to_close_timeout=timedelta(days=3650),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
        )
    return settled_result(t, intent, settled)


def settled_result(t: Tool, intent: Intent, settled: Settled) -> Any:
    fields = {
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
    raise ToolFailed(
        f"{t.name} {intent.step} was re-run after '{settled.decided_by}' said it had not "
        f"landed, and failed: {settled.reason}",
        **fields,
        error_type=settled.error_type,
    )
