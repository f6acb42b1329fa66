"""Calls on a real Temporal server: intents, keys, outcomes, bad input (no crashes here)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

import exactcall
from exactcall import Intent
from exactcall._model import intent_from_input
from exactcall._worker import build_worker
from exactcall.activities import Record
from exactcall.demo.bank import Bank
from tests import tools
from tests.conftest import plan, start_agent, step
from tests.workflows import Uncaught


async def scheduled_intents(client: Client, handle: WorkflowHandle[Any, Any]) -> list[Intent]:
    """The intents of the tool activities a run scheduled, as a reader of its history gets
    them (the input holds tool, version, arguments, hash, namespace, workflow id and step;
    the key is derived, the workflow type and task queue are the history's)."""
    out: list[Intent] = []
    workflow_type = ""
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            workflow_type = ev.workflow_execution_started_event_attributes.workflow_type.name
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            [value] = await client.data_converter.decode(a.input.payloads)
            assert {"tool", "args", "args_hash", "workflow_id", "step"} <= value.keys()
            queue = a.task_queue.name
            out.append(intent_from_input(value, workflow_type=workflow_type, task_queue=queue))
    return out


async def run_plan(client: Client, tq: str, *steps: dict[str, Any], **opts: Any) -> Any:
    handle = await start_agent(client, tq, plan(*steps, **opts))
    return handle, await handle.result()


async def test_intent_is_persisted_before_the_effect(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(client, tq, step("pay", bank.url, 10, who))
    receipt = out[0]["ok"]
    [intent] = await scheduled_intents(client, handle)
    assert intent.tool == "pay" and intent.tool_version == "1"
    assert intent.args == {"bank": bank.url, "amount": 10, "to": who}
    assert intent.args_hash == exactcall.intent_hash("pay", bank.url, 10, who)
    assert intent.workflow_id == handle.id and intent.step == "pay#1"
    assert intent.key == exactcall.derive_key("default", handle.id, "pay#1", "pay", "1")
    # the per-key record was claimed (with the intent) before the bank booked the payment
    view = await Record(client, intent).read()
    assert view is not None and view.state.phase == "done" and view.state.intent == intent
    booked = bank.payments()[-1]
    assert booked["id"] == receipt["payment_id"]
    assert view.since.isoformat() <= booked["created_at"].replace("Z", "+00:00")
    assert bank.count(to=who) == 1


async def test_ordinals_explicit_keys_and_deliberate_repeats(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(
        client,
        tq,
        step("pay", bank.url, 10, who),
        step("pay", bank.url, 10, who, key="second-payment"),
        step("pay", bank.url, 10, who),
        step("balance", bank.url, who),
        step("pay_v2", bank.url, 10, who),
    )
    assert all("ok" in o for o in out), out
    intents = await scheduled_intents(client, handle)
    assert [i.step for i in intents] == [
        "pay#1",
        "second-payment",
        "pay#2",
        "balance#1",
        "pay_v2#1",
    ]
    assert len({i.key for i in intents}) == 5
    assert intents[4].tool_version == "2"
    assert intents[4].key == exactcall.derive_key("default", handle.id, "pay_v2#1", "pay_v2", "2")
    assert out[3]["ok"] == 3  # the read-only balance saw three payments
    assert bank.count(to=who) == 4


async def test_same_key_in_one_workflow_runs_once_or_conflicts(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    _, out = await run_plan(
        client,
        tq,
        *[step("slow_pay", bank.url, 5, who, 0.3, key="k") for _ in range(4)],
        concurrent=True,
    )
    assert [o["ok"]["payment_id"] for o in out] == [out[0]["ok"]["payment_id"]] * 4
    assert bank.count(to=who) == 1
    _, out = await run_plan(
        client,
        tq,
        step("pay", bank.url, 5, who, key="once"),
        step("pay", bank.url, 5, who, key="once"),
        step("pay", bank.url, 9999, "mallory", key="once"),
    )
    assert out[0] == out[1]
    assert out[2]["error"] == "IntentConflict"
    assert bank.count(to=who) == 2
    assert bank.count(to="mallory") == 0


async def test_concurrent_reads_with_one_key_are_one_activity_or_a_conflict(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(
        client,
        tq,
        *[step("balance", bank.url, who, key="b") for _ in range(3)],
        step("balance", bank.url, "someone-else", key="b"),
        concurrent=True,
    )
    assert [o.get("ok") for o in out[:3]] == [0, 0, 0], out
    assert out[3]["error"] == "IntentConflict", out
    scheduled = [
        ev
        async for ev in handle.fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert len(scheduled) == 1  # one read, not three activities with one id
    # the same key read again later is a new read (reads are never recorded)
    _, again = await run_plan(
        client, tq, step("balance", bank.url, who, key="b"), step("balance", bank.url, who, key="b")
    )
    assert [o.get("ok") for o in again] == [0, 0]


async def test_tool_sees_its_key_and_a_key_parameter_stays_callable(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    with_own_key = {
        "tool": "whoami",
        "args": [bank.url, who],
        "kwargs": {"key": "the tool's own value"},
        "key": "step-a",
        "call_with": True,
    }
    default_key = {**with_own_key, "kwargs": {}, "key": "step-b"}
    handle, out = await run_plan(client, tq, with_own_key, default_key)
    a, b = out[0]["ok"], out[1]["ok"]
    assert a["key_param"] == "the tool's own value" and a["step"] == "step-a"
    assert b["key_param"] == "k" and b["step"] == "step-b"
    intents = await scheduled_intents(client, handle)
    assert a["idempotency_key"] == intents[0].key
    assert a["headers"] == {"Idempotency-Key": intents[0].key}
    assert a["args_hash"] == exactcall.intent_hash("whoami", bank.url, who, "the tool's own value")


async def test_ambiguous_call_with_key_param_is_refused(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(client, tq, step("whoami", bank.url, who, key="x"))
    assert out[0]["error"] == "InvalidCall"
    assert "has its own parameter 'key'" in out[0]["message"]
    assert await scheduled_intents(client, handle) == []
    assert bank.count(to=who) == 0


async def test_not_executed_is_retried_then_surfaces_as_tool_failed(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    await _faults(bank, fail_next=2)
    _, out = await run_plan(client, tq, step("pay_or_retry", bank.url, 7, who))
    assert out[0]["ok"]["amount"] == 7  # two 503s, then paid on attempt 3
    assert bank.count(to=who) == 1
    await _faults(bank, fail_next=50)
    try:
        _, out = await run_plan(client, tq, step("pay_or_retry", bank.url, 8, who))
    finally:
        await _faults(bank)
    assert out[0]["error"] == "ToolFailed"
    assert out[0]["fields"]["error_type"] == "BankUnavailable"
    assert bank.count(to=who) == 1


async def test_arbitrary_exception_is_unknown_and_not_retried(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(
        client, tq, step("pay_then_explode", bank.url, 3, who, on_unknown="raise")
    )
    assert out[0]["error"] == "AmbiguousOutcome"
    assert "RuntimeError" in out[0]["message"] and "not re-sent" in out[0]["message"]
    assert bank.count(to=who) == 1
    [intent] = await scheduled_intents(client, handle)
    view = await Record(client, intent).read()
    assert view is not None and view.state.phase == "unknown"


async def test_unserializable_result_is_recorded_as_done(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"agent-{uuid.uuid4().hex[:8]}"
    p = plan(step("pay_unserializable", bank.url, 4, who))
    out = await (await start_agent(client, tq, p, wid)).result()
    assert out[0]["error"] == "ResultNotSerializable"
    assert "recorded as done" in out[0]["message"]
    # a new run under the same workflow id does not free the key
    out = await (await start_agent(client, tq, p, wid)).result()
    assert out[0]["error"] == "ResultNotSerializable"
    assert bank.count(to=who) == 1


async def test_bad_input_runs_nothing(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle, out = await run_plan(
        client,
        tq,
        step("pay", bank.url, "ten", who),
        step("pay", bank.url, 1),
        step("pay", bank.url, 1, who, extra=True),
        step("no_such_tool", 1),
        step("pay", bank.url, 1, "x" * (300 * 1024)),
        step("pay", bank.url, 1, who, key=""),
    )
    assert [o["error"] for o in out] == [
        "InvalidCall",
        "InvalidCall",
        "InvalidCall",
        "UnknownTool",
        "ArgumentsTooLarge",
        "InvalidCall",
    ]
    assert "does not fit its annotation" in out[0]["message"]
    assert "missing a required argument: 'to'" in out[1]["message"]
    assert await scheduled_intents(client, handle) == []
    assert bank.count(to=who) == 0


async def test_unhandled_exactcall_error_fails_the_workflow(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await client.start_workflow(
        Uncaught.run,
        {"tool": "pay", "args": [bank.url, float("inf"), who]},
        id=f"u-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
    )
    with pytest.raises(WorkflowFailureError) as err:
        await handle.result()
    assert "not a JSON number" in str(err.value.cause)
    assert bank.count(to=who) == 0


async def test_sync_tool_blocking_longer_than_heartbeat_timeout_runs_once(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # heartbeat_timeout is 2 s: exactcall heartbeats for the tool while it blocks for 5 s
    handle, out = await run_plan(client, tq, step("blocking_pay", bank.url, 2, who, 5.0))
    assert out[0]["ok"]["amount"] == 2
    assert bank.count(to=who) == 1
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            assert ev.activity_task_started_event_attributes.attempt == 1


async def test_worker_without_plugin_is_refused(client: Client, tq: str) -> None:
    plain = await Client.connect(client.service_client.config.target_host)
    with pytest.raises(exactcall.ExactcallError, match=r"put exactcall\.Plugin"):
        Worker(plain, task_queue=tq, workflows=[Uncaught], plugins=[exactcall.Plugin()])


async def _faults(bank: Bank, **config: Any) -> None:
    import asyncio
    import json
    import urllib.request

    def post() -> None:
        req = urllib.request.Request(
            bank.url + "/faults",
            data=json.dumps(config).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5):
            pass

    await asyncio.to_thread(post)


@workflow.defn(sandboxed=False)  # defined in a test module: plain code, no sandbox re-import
class CallsToolDirectly:
    @workflow.run
    async def run(self, bank: str, to: str) -> Any:
        return tools.pay(bank, 10, to)  # not exactcall.call: would run unguarded


async def test_a_tool_called_directly_in_a_workflow_is_refused_and_runs_nothing(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    async with build_worker(client, tq, [CallsToolDirectly]):
        handle = await client.start_workflow(
            CallsToolDirectly.run, args=[bank.url, who], id=f"direct-{who}", task_queue=tq
        )
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
    assert "use await exactcall.call(pay" in str(info.value.cause).lower()
    assert bank.count(to=who) == 0
