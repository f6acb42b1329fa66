"""Server behaviour exactcall relies on, pinned so that a Temporal upgrade that changes it fails.

The call record (workflows/_record.py) is started by ``Record.claim()`` in activities/_records.py
with ``record_timing()``: a start delay longer than its execution timeout, so that it never runs
a workflow task and closes by itself. Markers are ``exactcall.mark`` signals that readers
(``Record.read()``) fold from the record's history; a marker for a closed record opens it again
as a new run. That is sound only while:

* a signal sent during the start delay is written to history at once and does not start a
  workflow task (a task in flight would buffer later signals out of the history readers fold,
  and would spend worker time per call);
* a workflow whose start delay outlasts its execution timeout times out then, with no workflow
  task ever scheduled; afterwards a signal to it is refused as not found, a start that rejects
  duplicates is refused (the claim stays taken), and a start that allows them opens a new run.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from exactcall.activities._records import NEVER_STARTS, record_timing
from exactcall.workflows import MARK_SIGNAL

RELIES = (
    "exactcall relies on this (activities/_records.py Record.claim() starts the call record "
    "with record_timing() and Record.mark()/read() write and fold 'exactcall.mark' signals from "
    "its history, with no workflow task ever run for a record)"
)


def _ids() -> tuple[str, str]:
    # no worker polls this queue: nothing but the server decides what lands in history
    return f"exactcall-contract-{uuid.uuid4().hex[:10]}", f"tq-nobody-{uuid.uuid4().hex[:8]}"


async def test_a_signal_during_start_delay_is_in_history_and_starts_no_workflow_task(
    client: Client,
) -> None:
    wid, tq = _ids()
    handle = await client.start_workflow(
        "exactcall.ServerContractProbe", id=wid, task_queue=tq, **record_timing()
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


async def test_a_record_times_out_without_a_task_and_a_start_opens_it_again(
    client: Client,
) -> None:
    wid, tq = _ids()

    async def start(
        arg: str, reuse: WorkflowIDReusePolicy, conflict: WorkflowIDConflictPolicy
    ) -> WorkflowHandle[Any, Any]:
        return await client.start_workflow(
            "exactcall.ServerContractProbe",
            arg,
            id=wid,
            task_queue=tq,
            id_reuse_policy=reuse,
            id_conflict_policy=conflict,
            start_delay=NEVER_STARTS,
            execution_timeout=timedelta(seconds=2),
        )

    reject, allow = WorkflowIDReusePolicy.REJECT_DUPLICATE, WorkflowIDReusePolicy.ALLOW_DUPLICATE
    fail = WorkflowIDConflictPolicy.FAIL
    first = await start("claim", reject, fail)
    await first.signal(MARK_SIGNAL, "marker")
    for _ in range(100):
        desc = await first.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    assert desc.status == WorkflowExecutionStatus.TIMED_OUT, (
        f"a workflow whose start delay outlasts its execution timeout did not time out at it "
        f"(status {desc.status}); {RELIES}"
    )
    names = [EventType.Name(ev.event_type) async for ev in first.fetch_history_events()]
    assert names == [
        "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT",
    ], f"a record ran or scheduled a workflow task, or did not close ({names}); {RELIES}"

    with pytest.raises(RPCError) as refused:
        await first.signal(MARK_SIGNAL, "late")
    assert refused.value.status == RPCStatusCode.NOT_FOUND, RELIES
    with pytest.raises(WorkflowAlreadyStartedError):  # the claim stays taken after it closed
        await start("claim again", reject, fail)
    again = await start("opened again", allow, fail)
    assert again.result_run_id != first.result_run_id
    with pytest.raises(WorkflowAlreadyStartedError):  # a second writer signals the open run
        await start("opened twice", allow, fail)
    await client.get_workflow_handle(wid).terminate("exactcall server-contract test")
