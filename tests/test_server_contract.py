"""Server behaviour exactcall relies on, pinned so that a Temporal upgrade that changes it fails.

The call record (workflows/_record.py) is started by ``Record.claim()`` in activities/_records.py
with ``start_delay=RECORD_START_DELAY``; markers are ``exactcall.mark`` signals that readers
(``Record.read()``) fold from the record's history. That is sound only while a signal sent during
the start delay (a) is written to history at once and (b) does not start a workflow task: a
task in flight would buffer later signals out of the history readers fold, and would spend worker
time per call.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from exactcall.activities._records import RECORD_START_DELAY
from exactcall.workflows import MARK_SIGNAL
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

RELIES = (
    "exactcall relies on this (activities/_records.py Record.claim() starts the call record "
    "with start_delay and Record.mark()/read() write and fold 'exactcall.mark' signals from its "
    "history, with no workflow task ever in flight while the call settles)"
)


async def test_a_signal_during_start_delay_is_in_history_and_starts_no_workflow_task(
    client: Client,
) -> None:
    # no worker polls this queue: nothing but the server decides what lands in history
    handle = await client.start_workflow(
        "exactcall.ServerContractProbe",
        id=f"exactcall-contract-{uuid.uuid4().hex[:10]}",
        task_queue=f"tq-nobody-{uuid.uuid4().hex[:8]}",
        start_delay=RECORD_START_DELAY,
        task_timeout=timedelta(seconds=2),
    )
    try:
        await handle.signal(MARK_SIGNAL, "first")
        await handle.signal(MARK_SIGNAL, "second")
        await asyncio.sleep(1.0)  # time for the server to schedule a task, if it ever would

        types = [ev.event_type async for ev in handle.fetch_history_events()]
        names = [EventType.Name(t) for t in types]
        assert types[0] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, names
        signaled = types.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        assert signaled == 2, (
            f"signals sent during start_delay are not in the workflow's history at once "
            f"(history: {names}); {RELIES}"
        )
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED not in types, (
            f"a signal sent during start_delay scheduled a workflow task (history: {names}); "
            f"{RELIES}"
        )
        desc = (await handle.describe()).raw_description
        assert not desc.HasField("pending_workflow_task"), (
            f"a workflow task is pending during start_delay after a signal: "
            f"{desc.pending_workflow_task}; {RELIES}"
        )
    finally:
        await handle.terminate("exactcall server-contract test")
