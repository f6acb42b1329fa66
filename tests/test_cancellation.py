"""Cancellation reaches the tool: cancelled workflows, cancelled callers, a worker's SIGTERM.

Real dev server and bank (effects counted at the destination); in-process workers where a
tool is held at a point (``tests.cancel_app.HELD``); a real worker process sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

import exactcall
from exactcall import Intent, RecordState, approvals, reconciliation
from exactcall._model import RecordEvent, RecordInit, intent_from_input
from exactcall._worker import build_worker
from exactcall.activities import Record
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.reconciliation._verdicts import Settled
from exactcall.testing import WorkerProcess, assert_replays
from exactcall.workflows import MARK_SIGNAL, record_id
from exactcall.workflows._unknown import CANCELLED_SIGNAL
from tests.cancel_app import (
    HELD,
    SAW_CANCEL,
    AbandonsApproval,
    HoldsTheJoin,
    SeesTheChildStart,
    SharedKey,
)
from tests.conftest import ROOT, WORKFLOWS, plan, start_agent, step

RUNNING = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
APP, FLOWS = "tests.cancel_app", "tests.workflows"


def build(client: Client, tq: str, **kw: Any) -> Worker:
    return build_worker(client, tq, [*WORKFLOWS, SharedKey, AbandonsApproval], **kw)


@pytest.fixture
async def worker(client: Client, tq: str) -> AsyncIterator[Worker]:
    async with build(client, tq) as w:
        yield w
        HELD.clear()  # a tool still held would make the shutdown wait for it


@pytest.fixture(autouse=True)
def held(who: str) -> Iterator[str]:
    """Every tool paying ``who`` waits until the test releases it."""
    HELD.add(who)
    yield who
    HELD.discard(who)


async def started(handle: WorkflowHandle[Any, Any], n: int = 1) -> None:
    """Until ``n`` activities of the workflow are running on a worker."""
    for _ in range(600):
        pending = (await handle.describe()).raw_description.pending_activities
        if sum(a.state == RUNNING for a in pending) >= n:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{n} activities of {handle.id} did not start")


async def cancel(handle: WorkflowHandle[Any, Any]) -> None:
    """Cancel the workflow; it ends CANCELED (the caller saw CancelledError and let it go)."""
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


async def intents(client: Client, handle: WorkflowHandle[Any, Any]) -> dict[str, Intent]:
    """The intents a workflow scheduled, by step (the settling attempt repeats one)."""
    out: dict[str, Intent] = {}
    workflow_type = ""
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            workflow_type = ev.workflow_execution_started_event_attributes.workflow_type.name
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            with contextlib.suppress(Exception):  # not an intent
                [value] = await client.data_converter.decode(a.input.payloads)
                intent = intent_from_input(
                    value, workflow_type=workflow_type, task_queue=a.task_queue.name
                )
                out[intent.step] = intent
    return out


async def activity_ids(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        ev.activity_task_scheduled_event_attributes.activity_id
        async for ev in handle.fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


_OPENED_BY = {"idle": "released", "unknown": "unknown", "calling": "calling", "done": "done"}


async def marks(client: Client, intent: Intent) -> list[str]:
    """The markers written to a key's record after its claim, in order (e.g. "released"), and
    "completed" when the call is done by its owner's activity completion (the attempt that
    claimed the record writes no marker for it: its completion is the done marker)."""
    handle = client.get_workflow_handle(record_id(intent.key))
    out = []
    try:
        events = [ev async for ev in handle.fetch_history_events()]
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        events = []  # no record: a run that holds its claim writes none on the happy path
    for ev in events:
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            attrs_st = ev.workflow_execution_started_event_attributes
            [init] = await client.data_converter.decode(attrs_st.input.payloads, [RecordInit])
            if init.state is not None:  # opened by a marker (no claim before the call)
                out.append(_OPENED_BY[init.state.phase])
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = ev.workflow_execution_signaled_event_attributes
            if attrs.signal_name == MARK_SIGNAL:
                [m] = await client.data_converter.decode(attrs.input.payloads, [RecordEvent])
                out.append(m.kind)
    view = await Record(client, intent).read()
    if view is not None and view.state.phase == "done" and out[-1:] != ["done"]:
        out.append("completed")
    return out


async def has_record(client: Client, key: str) -> bool:
    with contextlib.suppress(RPCError):
        return bool(await client.get_workflow_handle(record_id(key)).describe())
    return False


async def record(client: Client, intent: Intent) -> RecordState:
    view = await Record(client, intent).read()
    assert view is not None, f"{intent.step} has no record"
    return view.state


async def replays(handle: WorkflowHandle[Any, Any], folder: Path) -> None:
    """The cancelled run's history replays against this code (with its intents)."""
    folder.mkdir(exist_ok=True)
    (folder / f"{handle.id}.json").write_text((await handle.fetch_history()).to_json())
    await assert_replays(folder, workflows=[*WORKFLOWS, SharedKey, AbandonsApproval])


async def settled(client: Client, intent: Intent) -> Settled:
    """The verdict of the call's reconciliation (which outlives the cancelled workflow)."""
    rid = exactcall.reconciliation.reconcile_id(intent.key)
    return await client.get_workflow_handle(rid, result_type=Settled).result()


# -- cancelled before the tool started ------------------------------------------------------


def two_at_once(bank: Bank, a: str, b: str) -> dict[str, Any]:
    """Two calls at once (steps ``a`` and ``b``) of a tool that waits while its account is
    in ``HELD``: on one activity slot, one runs and the other stays scheduled."""
    return plan(
        step("cancel_wait_then_pay", bank.url, 10, a, key="a"),
        step("cancel_wait_then_pay", bank.url, 10, b, key="b"),
        concurrent=True,
    )


async def test_cancelled_before_the_tool_started_nothing_happens(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    # one activity slot: one call runs, the other is scheduled and cancelled before any
    # worker took it
    other = f"{who}-b"
    HELD.add(other)
    try:
        async with build(client, tq, max_concurrent_activities=1):
            handle = await start_agent(client, tq, two_at_once(bank, who, other))
            await started(handle)
            await cancel(handle)
    finally:
        HELD.discard(other)
    by_step = await intents(client, handle)
    claimed = [s for s, i in by_step.items() if await has_record(client, i.key)]
    assert len(claimed) == 1
    [never] = set(by_step) - set(claimed)
    # the one that never started: no record (its key was never claimed); a settling attempt,
    # which never calls the tool, found that out from the markers
    assert f"exactcall.settle:cancel_wait_then_pay[{never}]" in await activity_ids(handle)
    # the running one saw the cancellation and said it had not paid: its key is released
    ran = by_step[claimed[0]]
    released = await record(client, ran)
    assert released.phase == "idle"
    assert "cancelled before paying" in (released.reason or "")  # the tool said so
    assert await marks(client, ran) == ["released"]
    assert bank.count(to=who) == bank.count(to=other) == 0


async def test_cancelled_during_a_retry_backoff_leaves_the_key_released(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("cancel_refused_first", bank.url, 10, who)))
    for _ in range(200):  # until attempt 1 was refused (and attempt 2 is a minute away)
        desc = (await handle.describe()).raw_description
        if [a for a in desc.pending_activities if a.attempt == 2]:
            break
        await asyncio.sleep(0.05)
    [intent] = (await intents(client, handle)).values()
    assert (await record(client, intent)).phase == "idle"
    await cancel(handle)
    assert "exactcall.settle:cancel_refused_first#1" in await activity_ids(handle)
    assert (await record(client, intent)).phase == "idle"
    assert bank.count(to=who) == 0


# -- cancelled while the tool runs ----------------------------------------------------------


async def test_cancelled_tool_that_says_not_executed_fails_definitely_and_frees_its_key(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"agent-{uuid.uuid4().hex[:10]}"
    the_plan = plan(step("cancel_wait_then_pay", bank.url, 10, who))
    handle = await start_agent(client, tq, the_plan, wid=wid)
    await started(handle)
    await cancel(handle)
    [intent] = (await intents(client, handle)).values()
    assert (await record(client, intent)).phase == "idle"
    assert await marks(client, intent) == ["released"]
    assert bank.count(to=who) == 0
    # the key is released: a new run of the same workflow id makes the call (once)
    HELD.discard(who)
    again = await start_agent(client, tq, the_plan, wid=wid)
    [out] = await again.result()
    assert out["ok"]["to"] == who
    assert bank.count(to=who) == 1


async def test_cancelled_tool_that_says_nothing_is_reconciled_not_re_sent(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # it paid, then was cancelled while it waited: the outcome is unknown to exactcall
    handle = await start_agent(client, tq, plan(step("cancel_pay_then_wait", bank.url, 10, who)))
    await started(handle)
    await cancel(handle)
    [intent] = (await intents(client, handle)).values()
    verdict = await settled(client, intent)  # the reconciliation outlived the workflow
    assert (verdict.outcome, verdict.verdict, verdict.decided_by) == ("done", "landed", "probe")
    state = await record(client, intent)
    assert state.phase == "done" and state.result["to_account"] == who  # the bank's row
    assert await marks(client, intent) == ["unknown", "done"]
    assert bank.count(to=who) == 1


async def test_a_cancelled_call_that_did_not_land_is_not_run_again(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # cancelled before paying, but the tool did not say so: unknown; the probe finds nothing,
    # and a cancelled call is not re-run: its key is released instead
    handle = await start_agent(
        client, tq, plan(step("cancel_wait_then_pay_blindly", bank.url, 10, who))
    )
    await started(handle)
    await cancel(handle)
    [intent] = (await intents(client, handle)).values()
    verdict = await settled(client, intent)
    assert (verdict.outcome, verdict.verdict, verdict.error_type) == (
        "failed",
        "not_landed",
        "Cancelled",
    )
    assert (await record(client, intent)).phase == "idle"
    assert await marks(client, intent) == ["unknown", "not_landed"]
    HELD.discard(who)
    await asyncio.sleep(0.5)
    assert bank.count(to=who) == 0


async def test_a_sync_tool_sees_the_cancellation_and_its_result_is_recorded(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("cancel_sync_pay", bank.url, 10, who)))
    await started(handle)
    await cancel(handle)  # the caller gets CancelledError even though the tool returned
    [intent] = (await intents(client, handle)).values()
    state = await record(client, intent)
    assert state.phase == "done" and state.result["saw_cancel"] is True
    assert bank.count(to=who) == 1


async def test_a_cancelled_read_only_call_raises_cancelled_error(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # Agent turns exactcall errors into results: only a CancelledError ends it CANCELED
    handle = await start_agent(client, tq, plan(step("cancel_read_payments", bank.url, who)))
    await started(handle)
    await cancel(handle)
    for _ in range(100):  # like a plain activity: the tool is told when its heartbeat fails
        if who in SAW_CANCEL:
            break
        await asyncio.sleep(0.1)
    assert who in SAW_CANCEL


# -- several callers of one key -------------------------------------------------------------


async def test_one_cancelled_caller_does_not_cancel_the_shared_call(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await client.start_workflow(
        SharedKey.run,
        args=["cancel_pay_then_wait", bank.url, who],
        id=f"shared-{uuid.uuid4().hex[:10]}",
        task_queue=tq,
    )
    await started(handle)
    await handle.signal(SharedKey.cancel_first)
    await asyncio.sleep(1.0)  # a cancelled call would have been told by now (heartbeats: 0.5 s)
    HELD.discard(who)
    out = await handle.result()
    assert out["first"] == "cancelled"
    assert out["second"]["to"] == who
    [intent] = (await intents(client, handle)).values()
    assert await marks(client, intent) == ["completed"]
    assert bank.count(to=who) == 1


async def test_a_cancelled_workflow_cancels_calls_in_its_other_tasks(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str, tmp_path: Path
) -> None:
    # both callers run in tasks the workflow's cancellation does not reach; the call is
    # cancelled all the same, and its unknown outcome reconciled
    handle = await client.start_workflow(
        SharedKey.run,
        args=["cancel_pay_then_wait", bank.url, who],
        id=f"shared-{uuid.uuid4().hex[:10]}",
        task_queue=tq,
    )
    await started(handle)
    await cancel(handle)
    [intent] = (await intents(client, handle)).values()
    assert (await settled(client, intent)).outcome == "done"
    assert await marks(client, intent) == ["unknown", "done"]
    assert bank.count(to=who) == 1
    await replays(handle, tmp_path / "histories")


# -- cancelled while waiting ----------------------------------------------------------------


async def listed(lister: Any, client: Client, wid: str, present: bool = True) -> list[Any]:
    """Until the workflow's rows in a listing (pending, unresolved) are there (or gone)."""
    for _ in range(200):
        rows = [r for r in await lister(client) if r.workflow_id == wid]
        if bool(rows) == present:
            return rows
        await asyncio.sleep(0.1)
    raise TimeoutError(f"rows of {wid} in {lister.__name__} never became present={present}")


async def test_cancelled_while_waiting_for_approval_the_request_disappears(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str, tmp_path: Path
) -> None:
    handle = await start_agent(client, tq, plan(step("cancel_approved_pay", bank.url, 10, who)))
    [req] = await listed(approvals.list_pending, client, handle.id)
    await cancel(handle)
    await listed(approvals.list_pending, client, handle.id, present=False)
    memo = await (await handle.describe()).memo()
    assert memo.get("exactcall.pending") is None
    with pytest.raises(RPCError):  # nothing is left to approve: the workflow is closed
        await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash)
    assert bank.count(to=who) == 0
    await replays(handle, tmp_path / "histories")


async def test_a_later_approval_of_a_cancelled_call_is_rejected_as_not_pending(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await client.start_workflow(
        AbandonsApproval.run,
        args=[bank.url, who],
        id=f"abandons-{uuid.uuid4().hex[:10]}",
        task_queue=tq,
    )
    [req] = await listed(approvals.list_pending, client, handle.id)
    await handle.signal(AbandonsApproval.abort)
    await listed(approvals.list_pending, client, handle.id, present=False)
    assert (await approvals.view(client, handle.id)).pending == []
    late = await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash)
    assert not late.accepted
    assert late.outcome.startswith("not pending: the call was cancelled")
    await handle.signal(AbandonsApproval.finish)
    assert await handle.result() == "cancelled"
    assert not await has_record(client, req.key)
    assert bank.count(to=who) == 0


async def test_cancelled_while_waiting_for_the_verdict_the_reconciliation_goes_on(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # unknown, no probe: parked for a person while the agent waits; the agent is cancelled
    handle = await start_agent(client, tq, plan(step("cancel_pay_then_fail", bank.url, 10, who)))
    [row] = await listed(reconciliation.list_unresolved, client, handle.id)
    await cancel(handle)  # the workflow does not wait for the person
    [still] = await listed(reconciliation.list_unresolved, client, handle.id)
    assert still.step == row.step
    # a person says it did not land: a cancelled call is released, not run again
    res = await reconciliation.resolve(client, handle.id, row.step, "not_landed", by="oncall")
    assert res.accepted
    [intent] = (await intents(client, handle)).values()
    verdict = await settled(client, intent)
    assert (verdict.outcome, verdict.error_type) == ("failed", "Cancelled")
    assert (await record(client, intent)).phase == "idle"
    assert bank.count(to=who) == 1  # the one payment the tool made; never re-sent


async def test_cancelled_before_the_join_signal_is_sent_ends_cancelled(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    # The same call, cancelled in the workflow task that learns the reconciliation runs
    # already (its child start failed): the join signal is cancelled before it is sent, and
    # the SDK fails it with CancelledError. The worker is stopped after the start is asked,
    # so the start's failure and the cancellation land in one task, every time (left to
    # timing, 1 run in 5 to 15 hung: the error was taken for "the reconciliation has
    # closed" and the workflow waited for a person's verdict).
    sees = SeesTheChildStart()
    async with build(client, tq, interceptors=[sees]):
        handle = await start_agent(client, tq, plan(step("cancel_pay_then_fail", bank.url, 2, who)))
        assert await asyncio.to_thread(sees.reached.wait, 30)
    for _ in range(200):  # the worker is gone: the failed start waits in history
        types = [e.event_type async for e in handle.fetch_history_events()]
        if EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED in types:
            break
        await asyncio.sleep(0.05)
    await handle.cancel()
    async with build(client, tq):
        await asyncio.wait_for(cancel(handle), 30)
        events = [e async for e in handle.fetch_history_events()]
        types = [e.event_type for e in events]
        failed = types.index(EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED)
        asked = types.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
        # one task sees both: the first task completed after the failure started after the
        # cancel request (a task handed to the stopped worker's last poll, that timed out
        # unworked, may start in between under load: it decided nothing)
        done = next(
            e
            for e in events[failed:]
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        )
        worked = done.workflow_task_completed_event_attributes.started_event_id
        assert events[failed].event_id < events[asked].event_id < worked
        assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in types[asked:]  # no wait
        # the reconciliation was told, so "not landed" releases the key instead of re-sending
        [row] = await listed(reconciliation.list_unresolved, client, handle.id)
        res = await reconciliation.resolve(client, handle.id, row.step, "not_landed", by="oncall")
        assert res.accepted
        [intent] = (await intents(client, handle)).values()
        verdict = await asyncio.wait_for(settled(client, intent), 30)
    assert (verdict.outcome, verdict.error_type) == ("failed", "Cancelled")
    assert bank.count(to=who) == 1  # the one payment the tool made; never re-sent


async def test_cancelled_while_the_join_signal_is_in_flight_ends_cancelled(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    # The attempt that found the outcome unknown started the reconciliation, so the workflow
    # joins it by a signal. A cancellation that comes while that signal is in flight is
    # dropped by the SDK (a sent signal cannot be withdrawn): the call must end cancelled all
    # the same, and tell the reconciliation (before the fix the workflow waited on forever).
    hold = HoldsTheJoin()
    async with build(client, tq, interceptors=[hold]):
        handle = await start_agent(client, tq, plan(step("cancel_pay_then_fail", bank.url, 1, who)))
        assert await asyncio.to_thread(hold.reached.wait, 30)
        try:
            await handle.cancel()
        finally:
            hold.go.set()
        await asyncio.wait_for(cancel(handle), 30)
        types = [e.event_type async for e in handle.fetch_history_events()]
        sent = types.index(EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED)
        asked = types.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
        signalled = types.index(EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED)
        assert sent < asked < signalled  # the shape this test is about
        # the reconciliation was told, so "not landed" releases the key instead of re-sending
        [intent] = (await intents(client, handle)).values()
        rec = client.get_workflow_handle(exactcall.reconciliation.reconcile_id(intent.key))
        told = [
            e
            async for e in rec.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == CANCELLED_SIGNAL
        ]
        assert len(told) == 1
        res = await reconciliation.resolve(client, handle.id, intent.step, "not_landed", by="t")
        assert res.accepted
        assert (await settled(client, intent)).error_type == "Cancelled"
    assert bank.count(to=who) == 1  # the one payment the tool made; never re-sent


# -- a worker's graceful shutdown -----------------------------------------------------------


async def test_sigterm_lets_calls_finish_then_cancels_them(
    client: Client, server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    procs: list[WorkerProcess] = []

    def spawn() -> WorkerProcess:
        procs.append(WorkerProcess(server.address, tq, tools=[APP], workflows=[FLOWS], cwd=ROOT))
        return procs[-1]

    quick, lost, refused = f"{who}-quick", f"{who}-lost", f"{who}-refused"
    the_plan = plan(
        step("cancel_term_pay", bank.url, 10, quick, False, 2.0, key="quick"),  # done in time
        step("cancel_term_pay", bank.url, 10, lost, True, 60.0, key="lost"),  # paid, then slow
        step("cancel_term_pay", bank.url, 10, refused, False, 60.0, key="refused"),  # slow
        concurrent=True,
    )
    try:
        a = await spawn().started()
        handle = await start_agent(client, tq, the_plan)
        await started(handle, n=3)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a.proc.send_signal(signal.SIGTERM)
        assert await a.killed(timeout=60) == 0  # a graceful exit
        assert loop.time() - t0 >= 9.5  # in-flight calls had graceful_shutdown_timeout (10 s)
        await spawn().started()
        out = await handle.result()
    finally:
        for wp in procs:
            wp.stop()
    # the agent got every result (for "lost", the bank's row the probe found)
    assert [o["ok"].get("to") or o["ok"]["to_account"] for o in out] == [quick, lost, refused]
    by_step = await intents(client, handle)
    # finished within the grace period: done, by the first attempt
    assert await marks(client, by_step["quick"]) == ["completed"]
    # cancelled after the payment: recorded unknown, reconciled (the probe found it)
    assert await marks(client, by_step["lost"]) == ["unknown", "done"]
    # cancelled before the payment, and said so: released, then retried on the new worker
    assert await marks(client, by_step["refused"]) == ["released", "calling", "done"]
    assert [bank.count(to=x) for x in (quick, lost, refused)] == [1, 1, 1]


async def test_a_tool_may_run_longer_than_the_workers_own_heartbeat_deadline(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the worker times out an attempt that does not heartbeat through it after the heartbeat
    # timeout (2 s) plus about 5 s; exactcall's heartbeats go through it too
    handle = await start_agent(client, tq, plan(step("cancel_pay_then_wait", bank.url, 10, who)))
    await started(handle)
    await asyncio.sleep(8.0)
    HELD.discard(who)
    [out] = await handle.result()
    assert out["ok"]["to"] == who
    [intent] = (await intents(client, handle)).values()
    assert await marks(client, intent) == ["completed"]
    attempts = [
        ev.activity_task_started_event_attributes.attempt
        async for ev in handle.fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts == [1]  # the first attempt was never timed out
    assert bank.count(to=who) == 1


async def test_histories_recorded_before_cancellation_reached_calls_still_replay() -> None:
    # recorded with the code before this change (a cancelled caller did not cancel its call
    # then); the change is behind workflow.patched("exactcall.cancellation-reaches-calls")
    await assert_replays(
        ROOT / "tests" / "histories" / "cancel", workflows=[*WORKFLOWS, SharedKey, AbandonsApproval]
    )
