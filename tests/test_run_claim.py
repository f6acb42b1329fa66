"""One claim per run: the first run of a workflow id takes the fast path (no per-call
record), every later run the slow path, which reads the claimant run's history and describe.

Each case counts the effect at the bank (a real local HTTP server).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

import exactcall
from exactcall._worker import Connection, connect
from exactcall.activities import Record, _runs
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.workflows import record_id
from tests.cancel_app import HELD
from tests.conftest import plan, running_worker, start_agent, step
from tests.test_calls import scheduled_intents
from tests.test_cancellation import two_at_once
from tests.test_runs import completed_tasks, reset_to
from tests.workflows import Agent


async def has_record(client: Client, key: str) -> bool:
    try:
        await client.get_workflow_handle(record_id(key)).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def until(cond: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met"
        await asyncio.sleep(0.02)


async def test_the_first_run_claims_its_id_once_and_writes_no_per_call_record(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    steps = [step("pay", bank.url, n, who) for n in (1, 2, 3)]
    handle = await start_agent(client, tq, plan(*steps))
    out = await handle.result()
    assert bank.count(to=who) == 3
    # one claim record for the workflow id, naming this run
    assert await _runs.holder(client, handle.id) == handle.result_run_id
    intents = await scheduled_intents(client, handle)
    assert len(intents) == 3
    for intent, o in zip(intents, out, strict=True):
        assert not await has_record(client, intent.key)  # no per-call record at all
        # what the key says comes from the claimant run's completed activity
        view = await Record(client, intent).read()
        assert view is not None and view.state.phase == "done"
        assert view.state.result == o["ok"] and view.state.intent == intent
    # a re-run of the id takes the slow path and gets every result without paying again
    again = await start_agent(client, tq, plan(*steps), wid=handle.id)
    assert await again.result() == out
    assert bank.count(to=who) == 3
    assert await _runs.holder(client, handle.id) == handle.result_run_id


async def test_reset_after_the_call_was_scheduled_while_its_attempt_runs_pays_once(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the reset point comes after ActivityTaskScheduled: the new run re-dispatches the same
    # activity (attempt 1, same id) while the old run's attempt is still running
    handle = await start_agent(client, tq, plan(step("slow_pay", bank.url, 5, who, 1.0)))
    await until(lambda: bank.count(to=who) == 1)  # the old attempt has paid; still running
    [*_, last] = await completed_tasks(handle)
    new_run = await reset_to(client, handle, last)
    [out] = await client.get_workflow_handle(handle.id, run_id=new_run).result()
    # the old attempt records its result within the new attempt's wait: one payment, done
    assert "ok" in out, out
    assert out["ok"]["to"] == who
    assert bank.count(to=who) == 1
    assert await _runs.holder(client, handle.id) == handle.result_run_id  # still the first


async def test_reset_after_the_call_was_scheduled_with_a_lost_attempt_is_unknown_not_resent(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the old attempt pays and then would outlive the new attempt's wait (a heartbeat
    # timeout): the new run cannot know, so the call is unknown and parked, never sent again
    handle = await start_agent(
        client, tq, plan(step("slow_pay", bank.url, 5, who, 8.0, on_unknown="raise"))
    )
    await until(lambda: bank.count(to=who) == 1)
    [*_, last] = await completed_tasks(handle)
    new_run = await reset_to(client, handle, last)
    new = client.get_workflow_handle(handle.id, run_id=new_run)
    [out] = await new.result()
    assert out["error"] == "AmbiguousOutcome", out
    assert "first made this call" in out["message"]
    assert bank.count(to=who) == 1
    # the old attempt's heartbeats are refused since the reset: once its claim to run has run
    # out (by its worker's clock) its tool is cancelled, so it records no result; the call
    # stays unknown, paid once
    [intent, *_] = await scheduled_intents(client, new)
    view = await Record(client, intent).wait_done(timedelta(seconds=9))
    assert view is not None and view.state.phase == "unknown", view
    assert bank.count(to=who) == 1


async def test_a_call_the_closed_run_scheduled_but_never_started_runs_once_in_the_next(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    # one activity slot: call a runs (held), call b is scheduled and never starts; the run
    # is reset to its first task while a's attempt is still running
    other = f"{who}-b"
    HELD.add(who)
    try:
        async with running_worker(client, tq, max_concurrent_activities=1):
            handle = await start_agent(client, tq, two_at_once(bank, who, other))
            await asyncio.sleep(1.0)  # a is running (held), b is scheduled
            [first, *_] = await completed_tasks(handle)
            new_run = await reset_to(client, handle, first)
            HELD.discard(who)  # the old run's attempt of a pays now, after its run closed
            out = await client.get_workflow_handle(handle.id, run_id=new_run).result()
    finally:
        HELD.discard(who)
    by_to = {o["ok"]["to"]: o for o in out if "ok" in o}
    # b never ran in the closed run: the new run ran it, once
    assert bank.count(to=other) == 1 and other in by_to
    # a was in doubt (its attempt was running at close): never sent again; its late result
    # was recorded and returned, or it is unknown
    assert bank.count(to=who) == 1
    assert who in by_to or any(o.get("error") == "AmbiguousOutcome" for o in out), out


async def test_a_workflow_retry_gets_the_first_attempts_results(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"agent-{uuid.uuid4().hex[:10]}"
    handle = await client.start_workflow(
        Agent.run,
        plan(step("pay", bank.url, 10, who), fail_first_attempt=True),
        id=wid,
        task_queue=tq,
        retry_policy=RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=0.1)),
    )
    [out] = await handle.result()  # the second attempt (a new run) succeeds
    assert bank.count(to=who) == 1  # it took the slow path and found the first run's result
    latest = await client.get_workflow_handle(wid).describe()
    holder = await _runs.holder(client, wid)
    assert holder == handle.first_execution_run_id != latest.run_id
    assert out["ok"]["to"] == who


async def test_runs_with_per_call_records_make_later_runs_of_the_id_take_the_slow_path(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    per_call = await connect(
        Connection(address=server.address, namespace="default"),
        plugin=exactcall.Plugin(run_claims=False),
    )
    wid = f"agent-{uuid.uuid4().hex[:10]}"
    other_tq = f"{tq}-per-call"
    async with running_worker(per_call, other_tq):
        first = await start_agent(per_call, other_tq, plan(step("pay", bank.url, 10, who)), wid)
        [out] = await first.result()
    assert await _runs.holder(client, wid) == ""  # claimed for no run
    again = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)), wid)
    [out2] = await again.result()
    assert out2 == out
    assert bank.count(to=who) == 1
