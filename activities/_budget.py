"""The ``exactcall.budget`` local activity: a workflow's reservations on a budget's ledger.

``reserve`` is an Update-with-Start (the ledger starts at its budget's first call); a
refusal by the Update's validator comes back as ``ok=False`` with the ledger's figures.
``spend`` and ``release`` are signals to the running ledger (nothing waits for its workflow
task); one that has closed (idle for days, nothing reserved) has nothing left to settle.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._budget import ChargeAnswer, ChargeOp, ledger_input
from exactcall._wire import (
    BUDGET_ACTIVITY,
    BUDGET_OVER,
    BUDGET_RESERVE_UPDATE,
    BUDGET_SETTLE_SIGNAL,
    BUDGET_WORKFLOW,
)

__all__ = ["budget_charge"]

OVER = BUDGET_OVER


@activity.defn(name=BUDGET_ACTIVITY)
async def budget_charge(op: ChargeOp) -> ChargeAnswer:
    client = activity.client()
    if op.op != "reserve":
        try:
            await client.get_workflow_handle(op.ledger_id).signal(BUDGET_SETTLE_SIGNAL, op)
            return ChargeAnswer(ok=True, state="sent", limit=op.limit, window=op.window)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            return ChargeAnswer(ok=True, state="none", limit=op.limit, window=op.window)
    start = WithStartWorkflowOperation(
        BUDGET_WORKFLOW,
        ledger_input(op),
        id=op.ledger_id,
        task_queue=op.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"budget {op.budget} (limit {op.limit:g})",
    )
    try:
        return await client.execute_update_with_start_workflow(
            BUDGET_RESERVE_UPDATE, op, start_workflow_operation=start, result_type=ChargeAnswer
        )
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == OVER:
            figures = cause.details[0] if cause.details else {}
            return ChargeAnswer(
                ok=False,
                spent=figures.get("spent", 0.0),
                reserved=figures.get("reserved", 0.0),
                limit=figures.get("limit", op.limit),
                window=figures.get("window", op.window),
            )
        raise
