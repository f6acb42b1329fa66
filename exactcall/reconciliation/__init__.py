"""Settling calls whose outcome is unknown, from Python (the CLI is a thin layer over this)."""

from __future__ import annotations

import asyncio
import getpass
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from exactcall._confirm import confirm_by_query
from exactcall._model import RecordState
from exactcall.reconciliation._verdicts import (
    RECONCILE_STATE_QUERY,
    RESOLVE_SIGNAL,
    UNRESOLVED_ATTRIBUTE,
    UNRESOLVED_MEMO,
    CallAbandoned,
    Landed,
    NotLanded,
    ReconcileInput,
    ReconcileState,
    Resolution,
    Settled,
    Unknown,
    UnresolvedCall,
    reconcile_id,
)

__all__ = [
    "CallAbandoned",
    "FailedUndo",
    "Landed",
    "NotLanded",
    "ReconcileState",
    "Resolution",
    "ResolutionResult",
    "Settled",
    "Unknown",
    "UnresolvedCall",
    "find",
    "list_failed_undos",
    "list_unresolved",
    "reconcile_id",
    "recorded_outcome",
    "resolve",
    "state",
]


@dataclass(frozen=True)
class ResolutionResult:
    resolution: Resolution
    outcome: str | None
    """"accepted", "rejected: ...", or None when no worker confirmed it in time."""

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"


async def list_unresolved(client: Client) -> list[UnresolvedCall]:
    """Parked calls across workflows (visibility + memo; no worker needed)."""
    out: list[UnresolvedCall] = []
    query = f"{UNRESOLVED_ATTRIBUTE} = true AND ExecutionStatus = 'Running'"
    async for wf in client.list_workflows(query):
        row = (await wf.memo()).get(UNRESOLVED_MEMO)
        if row:
            out.append(UnresolvedCall.model_validate(row))
    return out


async def find(client: Client, workflow_id: str, step: str) -> UnresolvedCall:
    """The parked call ``step`` of ``workflow_id``."""
    for row in await list_unresolved(client):
        if row.workflow_id == workflow_id and row.step == step:
            return row
    raise LookupError(f"no unresolved call {step!r} in workflow {workflow_id!r}")


async def recorded_outcome(client: Client, row: UnresolvedCall) -> RecordState | None:
    """The call's recorded result, when an attempt recorded one after the call was parked
    (a late attempt of a frozen or cut-off worker); None otherwise."""
    from exactcall.activities._records import Record

    handle = client.get_workflow_handle(row.reconcile_id)
    async for ev in handle.fetch_history_events():
        attrs = ev.workflow_execution_started_event_attributes
        [inp] = await client.data_converter.decode(attrs.input.payloads, [ReconcileInput])
        break
    else:
        return None
    view = await Record(client, inp.intent).read()
    if view is None or view.state.phase != "done":
        return None
    return view.state


async def state(client: Client, reconcile_workflow_id: str) -> ReconcileState:
    handle = client.get_workflow_handle(reconcile_workflow_id)
    return await handle.query(RECONCILE_STATE_QUERY, result_type=ReconcileState)


async def resolve(
    client: Client,
    workflow_id: str,
    step: str,
    verdict: Literal["landed", "not_landed", "abandon"],
    *,
    result: Any = None,
    by: str | None = None,
    reason: str | None = None,
    confirm_timeout: float = 10.0,
) -> ResolutionResult:
    """A person's verdict on a parked call: ``landed`` (with the call's result),
    ``not_landed`` (run it once more with the same key) or ``abandon``."""
    row = await find(client, workflow_id, step)
    if verdict == "not_landed" and (done := await recorded_outcome(client, row)) is not None:
        # a late attempt made the call after all (a frozen or cut-off worker's): running it
        # once more would make it twice
        refused = Resolution(verdict=verdict, by=by or getpass.getuser(), reason=reason)
        return ResolutionResult(
            refused,
            "refused: the call's record holds a result, recorded by an attempt that made "
            "the call after its outcome was found unknown; it landed: resolve it --landed "
            f"--result '{json.dumps(done.result)}'",
        )
    res = Resolution(
        verdict=verdict,
        result=result,
        by=by or getpass.getuser(),
        reason=reason,
        resolution_id=uuid.uuid4().hex,
    )
    await client.get_workflow_handle(row.reconcile_id).signal(RESOLVE_SIGNAL, res)
    return ResolutionResult(res, await _confirm(client, row.reconcile_id, res, confirm_timeout))


async def _confirm(client: Client, rid: str, res: Resolution, timeout: float) -> str | None:
    """The reconciliation's answer to ``res``. A verdict that ends the call (landed, abandon)
    is confirmed once it is also recorded (the reconciliation has settled): a call made with
    the same key after this returns gets that verdict, not the outcome it had before."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def mine(st: ReconcileState) -> str | None:
        found = (o for r, o in st.resolutions if r.resolution_id == res.resolution_id)
        return next(found, None)

    outcome = await confirm_by_query(lambda: state(client, rid), mine, timeout)
    if outcome == "accepted" and res.verdict != "not_landed":
        left = max(0.5, deadline - loop.time())
        await confirm_by_query(lambda: state(client, rid), lambda st: st.settled, left)
    return outcome


class FailedUndo(BaseModel):
    """A step whose undo failed (a saga's, or ``exactcall undo``'s), not undone since."""

    workflow_id: str
    step: str
    error: str
    at: datetime
    listed_by: str
    """The workflow whose memo holds it (the saga's own, or ``exactcall-undo-<id>``)."""


async def list_failed_undos(client: Client) -> list[FailedUndo]:
    """Failed undos across workflows (visibility + memo; no worker needed), less the steps
    that ``exactcall undo`` has undone since."""
    from exactcall._wire import UNDO_FAILED_MEMO, undo_id
    from exactcall.undo._undo import UndoReport

    latest: dict[tuple[str, str], FailedUndo] = {}
    async for wf in client.list_workflows(f"{UNRESOLVED_ATTRIBUTE} = true"):
        row = (await wf.memo()).get(UNDO_FAILED_MEMO)
        if not isinstance(row, dict):
            continue
        for step, why in (row.get("failed") or {}).items():
            f = FailedUndo(
                workflow_id=row["workflow_id"],
                step=step,
                error=why,
                at=datetime.fromisoformat(row["at"]),
                listed_by=row.get("listed_by") or wf.id,
            )
            held = latest.get((f.workflow_id, step))
            if held is None or f.at > held.at:
                latest[(f.workflow_id, step)] = f
    undone: dict[str, set[str]] = {}
    for wid in {w for w, _ in latest}:
        h = client.get_workflow_handle(undo_id(wid), result_type=UndoReport)
        try:
            if (await h.describe()).status != WorkflowExecutionStatus.COMPLETED:
                continue  # still running, or it failed: nothing known undone by it
            report = await h.result(follow_runs=False)
        except RPCError:  # no exactcall undo of that workflow yet
            continue
        undone[wid] = set(report.undone)
    return [f for (wid, step), f in sorted(latest.items()) if step not in undone.get(wid, set())]
