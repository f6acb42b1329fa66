"""Client-side access to call records: claim a key, write markers, read what a key says."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from exactcall.workflows import MARK_SIGNAL, RECORD_WORKFLOW, record_id
from temporalio.api.enums.v1 import EventType, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._model import Intent, Owner, RecordEvent, RecordInit, RecordState
from exactcall._ui import call_summary

__all__ = ["RECORD_START_DELAY", "Record", "RecordView"]

RECORD_START_DELAY = timedelta(minutes=5)


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
        intent = self._intent
        try:
            await self._client.start_workflow(
                RECORD_WORKFLOW,
                RecordInit(intent=intent, owner=owner, attempt=attempt),
                id=self.id,
                task_queue=intent.record_task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                memo={
                    "tool": intent.tool,
                    "step": intent.step,
                    "workflow_id": intent.workflow_id,
                    "args_hash": intent.args_hash,
                },
                # a summary only: the intent is the record's input, which the UI shows (its
                # markdown details would add ~1 KB to every call's history)
                static_summary=call_summary(intent),
                # the record runs no code while its call is settling: markers are signals and
                # readers fold its history, so no worker time is spent per call and no task is
                # ever in flight (signals reaching a workflow with a task in flight are
                # buffered out of its history). After the delay it closes once done.
                start_delay=RECORD_START_DELAY,
                # a record's tasks are trivial: if a worker dies holding one, the server takes
                # it back quickly
                task_timeout=timedelta(seconds=2),
            )
        except WorkflowAlreadyStartedError:
            return False
        return True

    async def mark(self, event: RecordEvent, *, tries: int = 5) -> None:
        """Write a marker durably (a signal is in history when the call returns)."""
        delay = 0.2
        for i in range(tries):
            try:
                await self.handle.signal(MARK_SIGNAL, event)
                return
            except RPCError:
                if i == tries - 1:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def read(self) -> RecordView | None:
        """Fold the record's history into its state; None if the key has no record.

        Signals that reach a workflow while one of its tasks is in flight are buffered out of
        its history until that task ends; so wait until no record task is in flight first.
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
                    since = ev.event_time.ToDatetime().replace(tzinfo=UTC)
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
        """Poll the record for up to ``grace`` for a still-running attempt to finish."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace.total_seconds()
        view = await self.read()
        while view is not None and not view.state.final and loop.time() < deadline:
            await asyncio.sleep(0.25)
            view = await self.read()
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
