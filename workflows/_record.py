"""The call record: one small workflow per derived key, whose workflow id is the key.

Workflow id uniqueness makes it the claim on a key across runs, resets and continue-as-new;
its history is the durable marker store every attempt reads. The protocol lives in
``activities/_records.py`` (claim, mark, read: one module, used by the attempt and, through
the ``exactcall.mark_record`` activity, by the reconciliation); this module names the record
(``record_id``, ``MARK_SIGNAL``, ``MARK_RECORD``). Temporal stays the only store.

Records claimed today never run code: they close by themselves, timed out, after their
lifetime (``RECORD_LIFETIME``). ``CallRecord`` is the code of records written by exactcall
0.x before that (a 5-minute start delay, then it waited for a final marker and completed with
the state); it stays registered so that those drain, and replay.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from exactcall._model import RecordEvent, RecordInit, RecordState
from exactcall._wire import MARK_RECORD as MARK_RECORD
from exactcall._wire import MARK_SIGNAL as MARK_SIGNAL
from exactcall._wire import RECORD_STATE_QUERY
from exactcall._wire import RECORD_WORKFLOW as RECORD_WORKFLOW
from exactcall._wire import record_id as record_id

__all__ = [
    "MARK_RECORD",
    "MARK_SIGNAL",
    "RECORD_STATE_QUERY",
    "RECORD_WORKFLOW",
    "CallRecord",
    "mark_from_workflow",
    "record_id",
]


async def mark_from_workflow(key: str, event: RecordEvent) -> None:
    """Write a marker to the record of ``key`` by an external signal from workflow code: how
    reconciliations started before ``MARK_RECORD`` wrote them (their histories replay it)."""
    await workflow.get_external_workflow_handle(record_id(key)).signal(MARK_SIGNAL, event)


@workflow.defn(name=RECORD_WORKFLOW, sandboxed=False)  # pure code over exactcall's models
class CallRecord:
    """Holds the state of one key; attempts write markers to it as signals."""

    def __init__(self) -> None:
        self._state: RecordState | None = None
        self._pending: list[RecordEvent] = []

    @workflow.run
    async def run(self, init: RecordInit) -> RecordState:
        state = RecordState.start(init)
        for ev in self._pending:
            state = state.apply(ev)
        self._state = state
        self._pending.clear()
        await workflow.wait_condition(lambda: self._state is not None and self._state.final)
        if self._state is None:  # cannot happen (the condition above): fail the workflow
            raise ApplicationError(
                "exactcall.CallRecord: finished without a state", non_retryable=True
            )
        return self._state

    @workflow.signal(name=MARK_SIGNAL)
    def mark(self, ev: RecordEvent) -> None:
        if self._state is None:
            self._pending.append(ev)
        else:
            self._state = self._state.apply(ev)

    @workflow.query(name=RECORD_STATE_QUERY)
    def state(self) -> RecordState | None:
        return self._state
