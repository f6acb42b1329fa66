"""The record protocol, client side: claim a key, write markers, read what a key says.

A record is a workflow whose id is derived from the key (``record_id``), so claiming it is
atomic across runs, resets and re-runs. It never runs code: it starts with a start delay
longer than its lifetime (``RECORD_LIFETIME``), so it closes by itself, timed out, with no
worker task and no request. Its history is the marker store:

* **claim**: the record's start, whose input is the intent and the attempt chain that is
  about to call the tool (``RecordInit``);
* **markers**: ``exactcall.mark`` signals (``RecordEvent``), written when an attempt fails,
  is released, finds the outcome unknown, or cannot report its result to its own workflow,
  and by the reconciliation's verdicts. A record that closed is opened again for a marker:
  a new run under the same id, whose input carries the state so far;
* **done**: on the happy path nothing is written after the claim. The owner's activity
  completed with the result, and that completion is in the owner run's history, which a
  reader consults when the record says ``calling`` (``Record.read``).

Markers fold with ``RecordState.apply`` (``exactcall/_model.py``). Workflow code writes them
through the ``exactcall.mark_record`` activity (``activities/_probe.py``), the same code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._errors import ExactcallError
from exactcall._model import Intent, Owner, RecordEvent, RecordInit, RecordState
from exactcall._ui import call_summary
from exactcall._wire import MARK_SIGNAL, RECORD_WORKFLOW, record_id, undo_id
from exactcall.activities import _runs as runs
from exactcall.reconciliation._verdicts import reconcile_id
from exactcall.undo._undo import is_undo_step

__all__ = ["RECORD_LIFETIME", "Record", "RecordView", "record_timing"]

RECORD_LIFETIME = timedelta(minutes=5)
"""How long a record stays open after it is claimed (or opened again). It then closes by
itself (status "timed out": the server closes it, no worker runs anything). Markers that
come later open it again, so this bounds nothing but how long it is listed as running."""
NEVER_STARTS = timedelta(days=3650)
"""A record's start delay: longer than its lifetime, so its workflow code never runs."""
REOPEN_STALE = 0.5
"""Share of the lifetime after which a read made to open a record again is read anew (a run
opened by another writer after that read could otherwise have closed already)."""


def record_timing() -> dict[str, Any]:
    """The start options that make a record close by itself without a worker task."""
    return {"start_delay": NEVER_STARTS, "execution_timeout": RECORD_LIFETIME}


@dataclass(frozen=True)
class RecordView:
    """A record's state as read from its history, plus when the key was first claimed."""

    state: RecordState
    since: datetime
    closed: bool


class Record:
    """The record of one key, seen from an activity (or any client)."""

    def __init__(self, client: Client, intent: Intent) -> None:
        self._client = client
        self._intent = intent
        self.id = record_id(intent.key)

    @property
    def handle(self) -> WorkflowHandle[object, object]:
        return self._client.get_workflow_handle(self.id)

    async def claim(self, owner: Owner, attempt: int) -> bool:
        """Create the record (the pre-call marker). False if the key already has one."""
        try:
            await self._start(
                RecordInit(intent=self._intent, owner=owner, attempt=attempt),
                WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            return False
        return True

    async def _start(self, init: RecordInit, reuse: WorkflowIDReusePolicy) -> None:
        await self._client.start_workflow(
            RECORD_WORKFLOW,
            init,
            id=self.id,
            task_queue=init.intent.record_task_queue,
            id_reuse_policy=reuse,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            # a summary only: the intent is the record's input, which the UI shows
            static_summary=call_summary(init.intent),
            **record_timing(),
        )

    async def mark(self, event: RecordEvent, *, tries: int = 5) -> None:
        """Write a marker durably (it is in the record's history when this returns)."""
        delay = 0.2
        for i in range(tries):
            try:
                await self.handle.signal(MARK_SIGNAL, event)
                return
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:  # closed (or gone): open it again
                    if await self._reopen(event):
                        return
                    continue  # another writer opened it meanwhile: signal that run
                if i == tries - 1:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise ExactcallError(
            f"could not write the {event.kind!r} marker to the record of key "
            f"{self._intent.key}: it kept closing and opening again ({tries} tries)"
        )

    async def _reopen(self, event: RecordEvent) -> bool:
        """Open a closed record again, as a new run whose input is its state with ``event``
        applied. False if another writer opened it first."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        view = await self._fold()
        if loop.time() - began > REOPEN_STALE * RECORD_LIFETIME.total_seconds():
            return False  # read again: a run opened meanwhile may have closed since
        if view is not None and not view.closed:
            return False  # open after all (opened by another writer): signal it
        if view is None:  # no record (gone with retention): start one from this marker
            init = RecordInit(intent=self._intent, owner=event.owner, attempt=event.attempt)
            state, since = RecordState.start(init).apply(event), datetime.now(UTC)
        else:
            state, since = view.state.apply(event), view.since
        init = RecordInit(
            intent=state.intent, owner=state.owner, attempt=event.attempt, state=state, since=since
        )
        try:
            await self._start(init, WorkflowIDReusePolicy.ALLOW_DUPLICATE)
        except WorkflowAlreadyStartedError:
            return False
        return True

    async def read(self, *, claimant: bool = True) -> RecordView | None:
        """What the key says; None if nothing says anything of it.

        The markers, and, while they say ``calling``, the owner's own activity: when it
        completed, its result is the call's (the happy path writes no marker after the
        claim). With no record, the run that holds the workflow id's claim (``_runs``) made
        the call on its fast path, if anyone did: its activity says (``claimant``).
        """
        view = await self._fold()
        if view is None:
            return await self._claimant_view() if claimant else None
        if view.state.phase != "calling":
            return view
        done = await self._owner_completed(view.state)
        if done is None:
            return view
        return replace(view, state=view.state.apply(done))

    async def _fold(self) -> RecordView | None:
        """Fold the latest run's history into its state (markers only).

        Signals that reach a workflow while one of its tasks is in flight are buffered out of
        its history until that task ends (records written before they stopped running code
        did run tasks); so wait until no record task is in flight first.
        """
        if not await self._settled_history():
            return None
        conv = self._client.data_converter
        state: RecordState | None = None
        since: datetime | None = None
        closed = False
        try:
            async for ev in self.handle.fetch_history_events():
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                    attrs = ev.workflow_execution_started_event_attributes
                    [init] = await conv.decode(attrs.input.payloads, [RecordInit])
                    state = RecordState.start(init)
                    since = init.since or ev.event_time.ToDatetime().replace(tzinfo=UTC)
                elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    attrs_s = ev.workflow_execution_signaled_event_attributes
                    if attrs_s.signal_name == MARK_SIGNAL and state is not None:
                        [mark] = await conv.decode(attrs_s.input.payloads, [RecordEvent])
                        state = state.apply(mark)
                elif ev.event_type in _CLOSING:
                    closed = True
        except RPCError as exc:
            if _not_found(exc):
                return None
            raise
        if state is None or since is None:
            return None
        return RecordView(state=state, since=since, closed=closed)

    async def _claimant_view(self) -> RecordView | None:
        """The call as the claimant run's history and describe show it (no record)."""
        wid = self._intent.workflow_id
        holder = await runs.holder(self._client, wid)
        if not holder:
            return None
        seen = await runs.claimant_call(self._client, wid, holder, self._intent.key)
        if seen.status in ("absent", "not_called", "open") or seen.intent is None:
            return None
        try:
            intent = Intent.model_validate(seen.intent)
        except ValueError:
            intent = self._intent
        owner = Owner(run_id=holder, activity_id=seen.activity_id)
        state = RecordState(intent=intent, phase="calling", owner=owner, reason=seen.why or None)
        if seen.status == "done":
            done = RecordEvent(kind="done", owner=owner, attempt=0, result=seen.result)
            state = state.apply(done)
        since = seen.scheduled_at or datetime.now(UTC)
        return RecordView(state=state, since=since, closed=True)

    async def _owner_completed(self, state: RecordState) -> RecordEvent | None:
        """The owner's activity completion, as a ``done`` marker; None if it has none (yet).

        The owner is a run of the call's workflow, or of the key's reconciliation (a re-run),
        or for an undo, of the workflow's ``exactcall undo``.
        """
        owner = state.owner
        conv = self._client.data_converter
        i = state.intent
        owners = [i.workflow_id, reconcile_id(i.key)]
        if is_undo_step(i.step):
            owners.append(undo_id(i.workflow_id))
        for wid in owners:
            handle = self._client.get_workflow_handle(wid, run_id=owner.run_id)
            scheduled: set[int] = set()
            try:
                async for ev in handle.fetch_history_events():
                    if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                        attrs = ev.activity_task_scheduled_event_attributes
                        if attrs.activity_id == owner.activity_id:
                            scheduled.add(ev.event_id)
                    elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                        done = ev.activity_task_completed_event_attributes
                        if done.scheduled_event_id in scheduled:
                            payloads = done.result.payloads
                            values = await conv.decode(payloads) if payloads else [None]
                            return RecordEvent(
                                kind="done", owner=owner, attempt=0, result=values[0]
                            )
            except RPCError as exc:
                if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                    continue  # not this workflow's run
                raise
            return None  # the owner's run, with no completion of its activity (yet)
        return None

    async def _settled_history(self, limit: float = 30.0) -> bool:
        """False if there is no record; otherwise wait until no task of it is in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            try:
                desc = (await self.handle.describe()).raw_description
            except RPCError as exc:
                if _not_found(exc):
                    return False
                raise
            task = desc.pending_workflow_task
            in_flight = (
                desc.HasField("pending_workflow_task")
                and task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED
            )
            if not in_flight or loop.time() > deadline:
                return True
            await asyncio.sleep(0.1)

    async def wait_done(self, grace: timedelta) -> RecordView | None:
        """Poll the record for up to ``grace`` for a still-running attempt to finish (and
        write its outcome: a late attempt of a closed run may be the one that creates it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace.total_seconds()
        view = await self.read(claimant=False)
        while (view is None or not view.state.final) and loop.time() < deadline:
            await asyncio.sleep(0.25)
            view = await self.read(claimant=False)
        return view


def _not_found(exc: RPCError) -> bool:
    return exc.status == RPCStatusCode.NOT_FOUND


_CLOSING = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}
