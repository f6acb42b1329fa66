"""The guarded calls of one workflow run, read from its history alone (no workflow code).

Every fact comes from an event Temporal recorded: the intent is the input of the call's
activity; the outcome is how that activity closed (the last one of the step: a call cancelled
mid-flight is settled by one more attempt under ``exactcall.settle:``); a person's approval is
the grant inside the intent, and the ``exactcall.decide`` signals that carried it (their time,
and whether they were signed); a call that never ran because a person said no, or nobody
answered, is a request in the run's ``exactcall.pending`` memo that left it without an
activity: *denied* when a deny arrived before it left, *expired* when it left at its deadline,
*cancelled* otherwise. The verdict on an unknown outcome lives in the reconciliation's own
workflow (``exactcall audit`` reads its memo); a reconciliation the run waited for as a child
is read from the child's result.

Used by ``exactcall audit`` and its export, and by ``exactcall.testing.recorded_tools``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.service import RPCError

from exactcall._canonical import derive_key
from exactcall._history import HistoryCall, read_history
from exactcall._model import Intent
from exactcall._wire import (
    DECIDE_SIGNAL,
    MCP_PROXY_OWNED_WORKFLOW,
    MCP_PROXY_OWNER_REPORT_SIGNAL,
    MCP_PROXY_OWNER_REPORT_UPDATE,
    MCP_PROXY_TOOL,
    MCP_PROXY_TOOL_VERSION,
    PENDING_MEMO,
    REFUSED_MEMO,
    SETTLE_PREFIX,
    VERDICT_MEMO,
    reconcile_id,
)
from exactcall.undo._undo import is_undo_step, undo_step

__all__ = ["Approver", "RunCall", "calls_in_history", "link_undos", "settle", "with_verdicts"]

_ET = EventType


@dataclass
class Approver:
    """One person's yes (or no) to a call, as the decide signal carried it."""

    name: str
    at: datetime | None
    signed: bool
    decision: dict[str, Any] | None = None
    """The signal's payload (what a signature covers, with the run's workflow id)."""


@dataclass
class RunCall:
    """One guarded call of a run, and what became of it."""

    workflow_id: str
    run_id: str | None
    workflow_type: str
    step: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    key: str
    time: datetime
    """When the intent was persisted (its activity scheduled), or the approval requested."""
    outcome: str
    """done, undone, failed, conflict, unknown, unresolved, abandoned, denied, expired,
    cancelled, refused (by a budget, before anything ran), running, or pending (waiting for
    a person)."""
    tool_version: str | None = None
    ended_at: datetime | None = None
    attempts: int = 0
    error_type: str | None = None
    error: str | None = None
    error_details: tuple[Any, ...] = ()
    result: Payload | None = None
    """The recorded result of a done call (encoded as it is in the history)."""
    needed_approval: bool = False
    approved_by: list[Approver] = field(default_factory=list)
    denied_by: Approver | None = None
    reason: str | None = None
    """Why a call was denied (the decider's reason), the budget that refused it, or the
    reason given with the verdict on an unknown outcome."""
    verdict: str | None = None
    """For a call whose outcome was unknown: landed, not_landed, abandon (None: not yet)."""
    settled_by: str | None = None
    """Who gave the verdict (``probe``, or a person's name)."""
    settled_result: Any = None
    """The result a reconciliation settled a done call with (decoded)."""
    undone_by: str | None = None
    """The step of the done undo of an ``undone`` call (``exactcall.saga``)."""
    intent: Intent | None = None

    @property
    def reconcile_id(self) -> str:
        return reconcile_id(self.key)

    @property
    def was_unknown(self) -> bool:
        return self.outcome in ("unknown", "unresolved") or self.verdict is not None


_FAILED_TYPES = {"IntentConflict": "conflict", "AmbiguousOutcome": "unknown"}


def _outcome(c: HistoryCall) -> str:
    """How a call's activity closed, said as the audit says outcomes."""
    if c.closed == "failed":
        return _FAILED_TYPES.get(c.error_type or "", "failed")
    closed = {"completed": "done", "timed_out": "unknown", "canceled": "cancelled"}
    return closed.get(c.closed or "", "running")


@dataclass
class _Owned:
    """A write the MCP proxy sent itself (``exactcall.mcp.ProxyOwnedCall``): its intent is the
    run's input, its outcome the proxy's report."""

    input: Any = None
    at: datetime | None = None
    report: Any = None
    ended_at: datetime | None = None
    children: dict[str, datetime] = field(default_factory=dict)
    """Children started, and when (a reconciliation: the run found the outcome unknown)."""

    async def call(
        self,
        conv: DataConverter,
        wid: str,
        run_id: str | None,
        workflow_type: str,
        namespace: str,
    ) -> RunCall:
        inp, r = self.input, self.report if isinstance(self.report, dict) else {}
        step = str(inp.get("step", ""))
        args = {k: inp.get(k) for k in ("server", "tool", "arguments", "extra")}
        call = RunCall(
            workflow_id=wid,
            run_id=run_id,
            workflow_type=workflow_type,
            step=step,
            tool=MCP_PROXY_TOOL,
            tool_version=MCP_PROXY_TOOL_VERSION,
            args=args,
            args_hash=str(inp.get("args_hash", "")),
            key=derive_key(namespace, wid, step, MCP_PROXY_TOOL, MCP_PROXY_TOOL_VERSION),
            time=self.at or datetime.now(UTC),
            outcome="running",
            attempts=1,
        )
        kind = r.get("kind")
        call.ended_at = self.ended_at if kind else None
        if kind == "done":
            call.outcome = "done"
            call.result = conv.payload_converter.to_payloads([r.get("result")])[0]
        elif kind == "not_sent":
            call.outcome = "cancelled" if r.get("withdrawn") else "failed"
            call.error_type, call.error = "NotExecuted", r.get("message")
        elif kind == "unknown" or reconcile_id(call.key) in self.children:
            call.outcome, call.error = "unknown", r.get("message")  # (the proxy went quiet)
            call.ended_at = call.ended_at or self.children.get(reconcile_id(call.key))
        return call


@dataclass
class _Request:
    req: dict[str, Any]
    seen: datetime
    left: datetime | None = None


async def calls_in_history(
    history: WorkflowHistory,
    conv: DataConverter,
    *,
    run_id: str | None = None,
    namespace: str = "default",
) -> list[RunCall]:
    """The guarded calls of one run, in the order they were made (``namespace``: the one it
    ran in, for the key of a call that the MCP proxy sent itself)."""
    run = await read_history(history.events, conv)
    workflow_type = run.workflow_type
    run_id = run_id or run.original_run_id
    owned = _Owned(children=dict(run.children_started))
    if workflow_type == MCP_PROXY_OWNED_WORKFLOW and run.start_input is not None:
        owned.input = await _decode(conv, run.start_input)
        owned.at = run.started_at
    reports = [r for r in run.signals if r[1] == MCP_PROXY_OWNER_REPORT_SIGNAL]
    reports += [r for r in run.updates if r[1] == MCP_PROXY_OWNER_REPORT_UPDATE]
    for _, _, when, payloads in sorted(reports, key=lambda r: r[0]):  # in event order
        if payloads:
            owned.report = owned.report or await _decode(conv, payloads[0])
            owned.ended_at = owned.ended_at or when
    decisions: list[tuple[datetime, dict[str, Any]]] = []
    for _, name, when, payloads in run.signals:
        if name == DECIDE_SIGNAL and len(payloads) == 1:
            d = await _decode(conv, payloads[0])
            if isinstance(d, dict) and "decision" in d and "by" in d:
                decisions.append((when, d))
    requests: dict[str, _Request] = {}
    refused: list[tuple[Any, datetime]] = []
    for when, memo in run.memos:
        if PENDING_MEMO in memo:
            _pending_changed(requests, await _decode(conv, memo[PENDING_MEMO]), when)
        if REFUSED_MEMO in memo:
            refused.append((await _decode(conv, memo[REFUSED_MEMO]), when))
    children = {
        cid: await _decode(conv, payload)
        for cid, payload in run.children_completed.items()
        if payload is not None
    }

    wid = history.workflow_id
    out: list[RunCall] = []
    if isinstance(owned.input, dict):
        out.append(await owned.call(conv, wid, run_id, workflow_type, namespace))
    by_step: dict[str, RunCall] = {}
    for act in run.calls:
        i = act.intent
        call = by_step.get(i.step)
        if call is None or call.key != i.key:
            call = RunCall(
                workflow_id=i.workflow_id or wid,
                run_id=run_id,
                workflow_type=workflow_type or i.workflow_type,
                step=i.step,
                tool=i.tool,
                tool_version=i.tool_version,
                args=dict(i.args),
                args_hash=i.args_hash,
                key=i.key,
                time=act.scheduled_at,
                outcome="running",
                intent=i,
            )
            by_step[i.step] = call
            out.append(call)
        elif not act.activity_id.startswith(SETTLE_PREFIX) and call.outcome != "cancelled":
            # the same step scheduled again in this run (another call with the same key):
            # the first one's outcome stands
            continue
        call.attempts += act.attempts
        call.outcome = _outcome(act)
        call.ended_at = act.closed_at
        call.result = act.result
        call.error_type, call.error = act.error_type, act.error
        call.error_details = act.error_details
        if i.approval is not None:
            call.needed_approval = True
            call.approved_by = _approvers(i, decisions, act.scheduled_at)
    for call in out:
        settled = children.get(call.reconcile_id)
        if call.outcome == "unknown" and isinstance(settled, dict):
            settle(call, settled)

    link_undos(out)
    for step, r in requests.items():
        if step in by_step:
            by_step[step].needed_approval = True
            continue
        out.append(_unrun(wid, run_id, workflow_type, r, decisions, out))
    out += [_refused(r, at, run_id, workflow_type) for r, at in refused if isinstance(r, dict)]
    return out


def _refused(r: dict[str, Any], at: datetime, run_id: str | None, workflow_type: str) -> RunCall:
    """A call a budget refused before anything ran (the run's ``REFUSED_MEMO``)."""
    return RunCall(
        workflow_id=str(r.get("workflow_id", "")),
        run_id=run_id,
        workflow_type=workflow_type,
        step=str(r.get("step", "")),
        tool=str(r.get("tool", "")),
        tool_version=r.get("tool_version"),
        args=dict(r.get("args") or {}),
        args_hash=str(r.get("args_hash", "")),
        key=str(r.get("key", "")),
        time=_time(r.get("at")) or at,
        ended_at=at,
        outcome="refused",
        error_type="BudgetExceeded",
        error=r.get("message"),
        reason=f"budget {r.get('budget')}",
    )


def link_undos(calls: Iterable[RunCall], undos: Iterable[RunCall] = ()) -> None:
    """A done call whose undo (step ``<step>.undo``, of the same workflow id: in the run, or
    in ``undos``, made elsewhere) is done, or settled as landed, was undone."""
    calls = list(calls)
    done = {
        (u.workflow_id, u.step): u.step
        for u in [*calls, *undos]
        if is_undo_step(u.step) and u.outcome == "done"
    }
    for call in calls:
        by = done.get((call.workflow_id, undo_step(call.step)))
        if by is not None and call.outcome == "done":
            call.outcome, call.undone_by = "undone", by


async def with_verdicts(client: Client, calls: Iterable[RunCall]) -> None:
    """Each call whose outcome was unknown gets its reconciliation's verdict (its memo: the
    verdict, the outcome and who gave it); one with no reconciliation (yet) stays unknown."""
    for c in calls:
        if c.outcome != "unknown" and c.verdict is None:  # (a child's result has no reason)
            continue
        try:
            desc = await client.get_workflow_handle(c.reconcile_id).describe()
            memo = await desc.memo()
        except RPCError:
            continue  # no reconciliation was started (yet): the outcome stays unknown
        v = memo.get(VERDICT_MEMO)
        settle(c, v if isinstance(v, dict) else {})


def settle(call: RunCall, settled: dict[str, Any]) -> None:
    """Record a reconciliation's verdict on a call whose outcome was unknown: its result
    (``Settled``) or its memo (``verdict``, ``outcome``, ``by``)."""
    verdict = settled.get("verdict")
    if verdict not in ("landed", "not_landed", "abandon"):
        call.outcome = "unresolved"
        return
    by = settled.get("decided_by", settled.get("by"))
    call.verdict = verdict
    if settled.get("settler_reason"):  # the reason a person gave with the verdict
        call.reason = str(settled["settler_reason"])
    call.settled_by = by if isinstance(by, str) else None
    call.settled_result = settled.get("result")
    call.outcome = {"done": "done", "failed": "failed", "abandoned": "abandoned"}.get(
        str(settled.get("outcome")), "unresolved"
    )


def _pending_changed(requests: dict[str, _Request], value: Any, when: datetime) -> None:
    now = {r["step"]: r for r in value or () if isinstance(r, dict) and "step" in r}
    for step, req in now.items():
        if step not in requests or requests[step].left is not None:
            requests[step] = _Request(req, when)
    for step, seen in requests.items():
        if step not in now and seen.left is None:
            seen.left = when


def _unrun(
    wid: str,
    run_id: str | None,
    workflow_type: str,
    r: _Request,
    decisions: list[tuple[datetime, dict[str, Any]]],
    calls: list[RunCall],
) -> RunCall:
    """A request for approval whose step never ran an activity in this run."""
    req = r.req
    call = RunCall(
        workflow_id=req.get("workflow_id") or wid,
        run_id=run_id,
        workflow_type=workflow_type,
        step=req["step"],
        tool=req.get("tool", ""),
        args=dict(req.get("args") or {}),
        args_hash=req.get("args_hash", ""),
        key=req.get("key", ""),
        time=_time(req.get("requested_at")) or r.seen,
        outcome="pending",
        needed_approval=True,
    )
    if r.left is None:
        return call
    call.ended_at = r.left
    mine = [
        (at, d)
        for at, d in decisions
        if at <= r.left and d.get("step") == call.step and d.get("args_hash") == call.args_hash
    ]
    expires = _time(req.get("expires_at"))
    denies = [(at, d) for at, d in mine if d.get("decision") == "deny"]
    approves = [(at, d) for at, d in mine if d.get("decision") == "approve"]
    if expires is not None and r.left >= expires:
        call.outcome = "expired"
    elif denies:
        at, d = denies[-1]
        call.outcome = "denied"
        call.denied_by = Approver(d["by"], at, bool(d.get("signature")), d)
        call.reason = d.get("reason")
    elif approves:
        # a framework's approval (step TOOL@CALL_ID): the call then runs under its own step
        approvers = _latest_by_name(approves)
        ran = next(
            (
                c
                for c in calls
                if c.tool == call.tool
                and c.args_hash == call.args_hash
                and c.time >= r.left
                and not c.approved_by
            ),
            None,
        )
        if ran is not None:
            ran.needed_approval = True
            ran.approved_by = approvers
            call.outcome = "approved"
            call.approved_by = approvers
            call.reason = f"ran as step {ran.step}"
        else:
            call.outcome = "approved"
            call.approved_by = approvers
    else:
        call.outcome = "cancelled"
    return call


def _approvers(
    i: Intent, decisions: list[tuple[datetime, dict[str, Any]]], before: datetime
) -> list[Approver]:
    """The approvers named by the grant, each with the decide signal that carried their yes
    (their last one before the call was scheduled: earlier ones may have been refused)."""
    assert i.approval is not None
    named = set(i.approval.approved_by)
    mine = [
        (at, d)
        for at, d in decisions
        if at <= before
        and d.get("decision") == "approve"
        and d.get("by") in named
        and (d.get("step") == i.step or (d.get("step") is None and d.get("tool") == i.tool))
    ]
    found = {a.name: a for a in _latest_by_name(mine)}
    return [
        found.get(name) or Approver(name, i.approval.decided_at, False)
        for name in i.approval.approved_by
    ]


def _latest_by_name(decisions: Iterable[tuple[datetime, dict[str, Any]]]) -> list[Approver]:
    out: dict[str, Approver] = {}
    for at, d in decisions:
        out[d["by"]] = Approver(d["by"], at, bool(d.get("signature")), d)
    return list(out.values())


async def _decode(conv: DataConverter, payload: Payload) -> Any:
    try:
        [value] = await conv.decode([payload])
    except Exception:
        return None
    return value


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            return None
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None
