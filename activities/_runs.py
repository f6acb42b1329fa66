"""The per-run claim: one record per workflow id that names the first run to make a call.

Temporal keeps at most one open run per workflow id, and a closed run never starts a new
activity attempt. So a run whose calls no earlier run can have made needs no per-call record:
its attempts' own synchronous heartbeats (``calling`` before the tool runs) and completions
are its markers, and they stay readable after the run closes (describe lists the attempts
pending at close, frozen; the history has the completions). What has to be proven, once per
run, is that no earlier run of the workflow id made calls:

* **the claim** (``claimant``): the first guarded call of a run starts the workflow id's
  claim record (``exactcall-run-<workflow id>``, input: the claimant's run id), atomically,
  with ``REJECT_DUPLICATE`` and a request id bound to the run, so the claimant's own retries
  (on any worker) are answered "yours" and every other run is refused and reads who holds it.
  The record never runs code: it starts with a start delay longer than its lifetime and
  closes by itself. It is made inside the guarded activity, never in workflow code, so it
  changes no workflow command (a reset run replays its base run's history with a new run id:
  a branch on it in workflow code is a nondeterminism error);
* **the fast path**: the claim names this very run (``activity.info().workflow_run_id``).
  Only the claimant run ever takes it; the claim is cached per worker process;
* **the slow path**: every other run (reset, continue-as-new, workflow retry, a re-run of the
  id) and every run of a workflow id claimed before this protocol. It uses the per-call
  records (``_records``), which are the registry of every non-claimant run's calls, and
  reads the one run that wrote none, the claimant, by its history and its describe
  (``claimant_call``): a completion there is the call's result; an attempt that was running
  (STARTED) or had run (attempt > 1) at close is in doubt; one scheduled and never started
  never ran. The claimant run is closed whenever another run of its id is open, so what it
  says is final (a late attempt of it that is still running leaves its outcome on the
  per-call record, which the slow path waits for).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.api.common.v1 import Payloads, WorkflowExecution, WorkflowType
from temporalio.api.enums.v1 import (
    EventType,
    PendingActivityState,
    WorkflowExecutionStatus,
    WorkflowIdConflictPolicy,
    WorkflowIdReusePolicy,
)
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    StartWorkflowExecutionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from exactcall._history import read_history
from exactcall._model import Intent
from exactcall._ui import claim_summary
from exactcall._wire import RUN_CLAIM_WORKFLOW as RUN_CLAIM_WORKFLOW
from exactcall._wire import run_claim_id as run_claim_id

__all__ = [
    "RUN_CLAIM_WORKFLOW",
    "Chain",
    "ClaimantCall",
    "chain_doubt",
    "claimant",
    "claimant_call",
    "holder",
    "run_chains",
    "run_claim_id",
]

CLAIM_LIFETIME = timedelta(minutes=5)
"""How long a claim record is listed as running; then it closes by itself, and keeps refusing
other runs (REJECT_DUPLICATE) for the namespace's retention."""
_NEVER_STARTS = timedelta(days=3650)
_REQUEST_NS = uuid.UUID("5d0c1f52-56a6-4c39-9d0e-3b8f1a3f7e21")
_CACHE_SIZE = 4096
_NOT_CALLED_TYPES = frozenset({"NotExecuted", "IntentConflict", "InvalidCall", "ApprovalMissing"})
"""Failures after which the attempt is known not to have called the tool."""


class _Lru(OrderedDict[Any, Any]):
    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _CACHE_SIZE:
            self.popitem(last=False)


_claimants: _Lru = _Lru()
"""(namespace, workflow id, run id) -> the claimant's run id, per worker process."""
_claimant_calls: _Lru = _Lru()
"""(namespace, workflow id, claimant run id) -> what the (closed) claimant did, by key."""
_in_flight: dict[Any, asyncio.Future[Any]] = {}


async def _once(cache: _Lru, key: Any, make: Any) -> Any:
    """``make()`` once per key in this process (concurrent askers share one request)."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    running = _in_flight.get(key)
    if running is not None:
        return await asyncio.shield(running)
    fut: asyncio.Future[Any] = asyncio.ensure_future(make())
    _in_flight[key] = fut
    try:
        value = await asyncio.shield(fut)
    finally:
        _in_flight.pop(key, None)
    if value is not None:
        cache.put(key, value)
    return value


async def claimant(client: Client, intent: Intent, run_id: str, *, fast: bool = True) -> str:
    """The run id that holds the claim on ``intent.workflow_id``, claiming it for ``run_id``
    if nobody does; ``""`` when no run may take the fast path (``fast=False``: a run that
    uses per-call records claims the id for nobody, so no later run of it is taken for the
    first), or when it cannot be told. The slow path then reads records only."""
    key = (client.namespace, intent.workflow_id, run_id)
    return str(await _once(_claimants, key, lambda: _claim(client, intent, run_id, fast)))


def _request_id(namespace: str, workflow_id: str, run_id: str) -> str:
    """Bound to the run: the claimant's own repeat of its claim is answered "started"."""
    return str(uuid.uuid5(_REQUEST_NS, f"{namespace}/{workflow_id}/{run_id}"))


async def _claim(client: Client, intent: Intent, run_id: str, fast: bool) -> str:
    conv = client.data_converter
    holder_run = run_id if fast else ""
    payloads = await conv.encode([{"workflow_id": intent.workflow_id, "run_id": holder_run}])
    req = StartWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_id=run_claim_id(intent.workflow_id),
        workflow_type=WorkflowType(name=RUN_CLAIM_WORKFLOW),
        task_queue=TaskQueue(name=intent.record_task_queue),
        input=Payloads(payloads=payloads),
        identity=client.identity,
        request_id=_request_id(client.namespace, intent.workflow_id, run_id),
        workflow_id_reuse_policy=WorkflowIdReusePolicy.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
        workflow_id_conflict_policy=WorkflowIdConflictPolicy.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
    )
    [summary] = await conv.encode([claim_summary(intent.workflow_id, holder_run)])
    req.user_metadata.summary.CopyFrom(summary)
    req.workflow_execution_timeout.FromTimedelta(CLAIM_LIFETIME)
    req.workflow_start_delay.FromTimedelta(_NEVER_STARTS)
    for _ in range(3):
        try:
            await client.workflow_service.start_workflow_execution(req, retry=True)
            return holder_run
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
        held_by = await holder(client, intent.workflow_id)
        if held_by is not None:
            return held_by
        # gone between the refusal and the read (retention): claim again
    return ""


async def holder(client: Client, workflow_id: str) -> str | None:
    """The run that holds the claim on ``workflow_id`` (None: nobody claimed it), read
    without claiming."""
    handle = client.get_workflow_handle(run_claim_id(workflow_id))
    try:
        async for ev in handle.fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                attrs = ev.workflow_execution_started_event_attributes
                [claim] = await client.data_converter.decode(attrs.input.payloads)
                return str(claim.get("run_id", "")) if isinstance(claim, dict) else ""
            break
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return ""


@dataclass
class ClaimantCall:
    """What the claimant run did about one key."""

    status: str = "absent"
    """``absent`` (never scheduled there), ``not_called`` (scheduled, never called),
    ``done`` (completed: ``result``), ``in_doubt`` (an attempt may have called the tool),
    or ``open`` (the claimant run is still open: this attempt belongs to a closed run)."""
    result: Any = None
    args_hash: str | None = None
    scheduled_at: datetime | None = None
    why: str = ""
    intent: dict[str, Any] | None = None
    activity_id: str = ""


@dataclass
class Chain:
    """One activity of one key in a run's history."""

    key: str
    args_hash: str
    intent: dict[str, Any]
    activity_id: str
    scheduled_at: datetime
    min_timeout: timedelta
    done: bool = False
    result: Any = None
    closed: str | None = None
    """How it closed without completing: "failed", "timed out", "canceled"."""
    closed_at: datetime | None = None
    started: bool = False
    failure_type: str = ""

    def cancelled_unstarted(self) -> bool:
        """Cancelled before any attempt could have started, provably.

        Its history has no ActivityTaskStarted and it was cancelled sooner after it was
        scheduled than any attempt could have timed out (an attempt that crashed is retried,
        and a cancel that arrives in the back-off before the retry starts leaves no trace of
        the crashed attempt in the history; the timeout comes first). Definite failures that
        are retried write the per-call record, which is read besides this."""
        return (
            self.closed == "canceled"
            and not self.started
            and self.closed_at is not None
            and self.closed_at - self.scheduled_at < self.min_timeout
        )


@dataclass
class _RunView:
    open: bool
    gone: bool = False
    chains: dict[str, list[Chain]] = field(default_factory=dict)
    pending: dict[str, tuple[int, int, bool, Any]] = field(default_factory=dict)


async def claimant_call(client: Client, workflow_id: str, run_id: str, key: str) -> ClaimantCall:
    """What run ``run_id`` of ``workflow_id`` (the claimant, which wrote no per-call records
    on its fast path) did about ``key``."""
    cache_key = (client.namespace, workflow_id, run_id)
    view: _RunView = await _once(
        _claimant_calls, cache_key, lambda: _read_run(client, workflow_id, run_id)
    )
    if view.open:
        _claimant_calls.pop(cache_key, None)  # not final yet
        return ClaimantCall(status="open", why="the claimant run is still open")
    if view.gone:
        return ClaimantCall(
            status="in_doubt", why="its history is gone (the namespace's retention)"
        )
    chains = view.chains.get(key, [])
    if not chains:
        return ClaimantCall()
    first = chains[0]
    out = ClaimantCall(
        args_hash=first.args_hash,
        scheduled_at=first.scheduled_at,
        intent=first.intent,
        activity_id=first.activity_id,
    )
    for chain in chains:
        if chain.done:
            out.status, out.result, out.activity_id = "done", chain.result, chain.activity_id
            return out
    for chain in chains:
        why = chain_doubt(chain, view.pending.get(chain.activity_id))
        if why:
            out.status, out.why = "in_doubt", why
            return out
    out.status = "not_called"
    return out


def chain_doubt(chain: Chain, pending: tuple[int, int, bool, Any] | None = None) -> str:
    """Why this chain may have called the tool ("" when it cannot have); ``pending``: its
    attempt as its closed run's describe lists it, if it was pending at close."""
    if pending is not None:
        state, attempt, started, phase = pending
        if state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED or started:
            return "its attempt was running when its run closed"
        if attempt > 1:
            return f"attempt {attempt - 1} had run when its run closed"
        if phase in ("calling", "done"):
            return "an attempt had written its pre-call heartbeat"
        return ""  # scheduled, attempt 1, never started: never ran
    if chain.closed is None:
        return "its activity has no outcome in the closed run"
    if chain.closed == "failed" and chain.failure_type in _NOT_CALLED_TYPES:
        return ""
    if chain.cancelled_unstarted():
        return ""
    return f"its activity {chain.closed} after an attempt may have started"


async def run_chains(client: Client, workflow_id: str, run_id: str) -> dict[str, list[Chain]]:
    """Every guarded activity of one run, by key, from its history (an open run too)."""
    chains, _ = await _history(client, workflow_id, run_id)
    return chains


async def _read_run(client: Client, workflow_id: str, run_id: str) -> _RunView:
    try:
        desc = await client.workflow_service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            ),
            retry=True,
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return _RunView(open=False, gone=True)  # deleted with retention
    status = desc.workflow_execution_info.status
    if status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
        return _RunView(open=True)
    chains, _ = await _history(client, workflow_id, run_id)
    view = _RunView(open=False, chains=chains)
    conv = client.data_converter
    for p in desc.pending_activities:
        phase = None
        if p.HasField("heartbeat_details") and p.heartbeat_details.payloads:
            try:
                [details] = await conv.decode(p.heartbeat_details.payloads)
                phase = details.get("phase") if isinstance(details, dict) else None
            except Exception:
                phase = "calling"  # unreadable: assume the worst
        started = p.HasField("last_started_time") and p.last_started_time.seconds > 0
        view.pending[p.activity_id] = (p.state, p.attempt, started, phase)
    return view


async def _history(
    client: Client, workflow_id: str, run_id: str
) -> tuple[dict[str, list[Chain]], int]:
    """Each call's activities in the run's history (``exactcall._history``), by key."""
    conv = client.data_converter
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    run = await read_history(handle.fetch_history_events(), conv)
    chains: dict[str, list[Chain]] = {}
    for c in run.calls:
        chain = Chain(
            key=c.intent.key,
            args_hash=c.intent.args_hash,
            intent=c.intent.model_dump(mode="json"),
            activity_id=c.activity_id,
            scheduled_at=c.scheduled_at,
            min_timeout=c.min_timeout,
            started=c.started,
        )
        if c.closed == "completed":
            chain.done = True
            chain.result = (await conv.decode([c.result]))[0] if c.result is not None else None
        elif c.closed is not None:
            chain.closed = {"timed_out": "timed out"}.get(c.closed, c.closed)
            chain.closed_at = c.closed_at
            chain.failure_type = c.failure_type or ""
        chains.setdefault(chain.key, []).append(chain)
    return chains, run.events
