"""Who starts a reconciliation, and what it runs from: its input, never the worker's registry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

import exactcall
from exactcall import reconciliation
from exactcall._canonical import args_hash, derive_key
from exactcall._model import Intent, Owner
from exactcall.activities._records import Record
from exactcall.demo.bank import Bank
from exactcall.reconciliation._verdicts import (
    RECONCILE_WORKFLOW,
    RESOLVE_SIGNAL,
    CallSpec,
    ReconcileInput,
    Resolution,
    Settled,
    reconcile_id,
)
from tests.conftest import plan, start_agent, step
from tests.test_approvals import eventually
from tests.tools import FAST
from tests.workflows import Agent


async def test_the_attempt_that_finds_the_outcome_unknown_routes_it(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    """The reconciliation starts from the attempt, not at the agent's next workflow task (which
    may first wait out a dead worker's sticky queue); the agent joins it."""
    h = await start_agent(
        client, tq, plan(step("pay_then_explode", bank.url, 7, who, on_unknown="raise"))
    )
    [out] = await h.result()
    assert out["error"] == "AmbiguousOutcome", out
    key = derive_key("default", h.id, "pay_then_explode#1", "pay_then_explode", "1")
    rec = client.get_workflow_handle(reconcile_id(key))
    desc = await rec.describe()
    assert desc.parent_id is None, "started by the attempt, not as the agent's child"
    first = await anext(aiter(rec.fetch_history_events()))
    [inp] = await client.data_converter.decode(
        first.workflow_execution_started_event_attributes.input.payloads, [ReconcileInput]
    )
    assert inp.call is not None and inp.call.heartbeat_timeout == FAST
    assert inp.intent.workflow_id == h.id and "raised" in inp.reason
    kinds = [e.event_type async for e in h.fetch_history_events()]
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED in kinds  # joined
    assert EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED not in kinds
    row = await eventually(
        lambda: reconciliation.find(client, h.id, "pay_then_explode#1"),
        lambda r: r.reconcile_id == rec.id,
        timeout=20,
    )
    assert row.args_hash == inp.intent.args_hash
    assert len([p for p in bank.payments() if p["to_account"] == who]) == 1


async def test_a_waiting_agent_gets_the_verdict_by_signal_holding_no_worker_slot(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    """While the call is parked the agent has no activity running (nothing occupies a worker
    slot for days); a person's verdict reaches it as the reconciliation's signal."""
    h = await start_agent(client, tq, plan(step("pay_then_explode", bank.url, 8, who)))
    row = await eventually(
        lambda: reconciliation.find(client, h.id, "pay_then_explode#1"),
        lambda r: r is not None,
        timeout=20,
    )
    desc = await h.describe()
    assert not desc.raw_description.pending_activities, "an activity waits for the verdict"
    await reconciliation.resolve(
        client, h.id, "pay_then_explode#1", "landed", result={"id": 1}, by="ops"
    )
    [out] = await h.result()
    assert out["ok"] == {"id": 1}, out
    events = [e async for e in h.fetch_history_events()]
    signals = [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert "exactcall.settled" in signals
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == ["pay_then_explode"]
    assert len([p for p in bank.payments() if p["to_account"] == who]) == 1
    assert row.reconcile_id.startswith("exactcall-reconcile-")


GHOST_RUNS: list[dict[str, Any]] = []


@activity.defn(name="ghost_pay")
async def ghost_pay(intent: dict[str, Any]) -> dict[str, Any]:
    """The activity of a tool this process never registered with ``@exactcall.tool``."""
    GHOST_RUNS.append(intent)
    return {"paid": intent["args"]["amount"]}


async def test_a_rerun_is_scheduled_from_the_input_not_the_registry(client: Client) -> None:
    """The reconciliation of a call whose tool this worker does not know still re-runs it, as
    its input says (a worker that imported other modules decides the same)."""
    tq = f"ghost-{uuid.uuid4().hex[:8]}"
    wid = f"ghost-agent-{uuid.uuid4().hex[:8]}"
    args = {"amount": 5}
    intent = Intent(
        tool="ghost_pay",
        tool_version="1",
        args=args,
        args_hash=args_hash("ghost_pay", args),
        namespace="default",
        workflow_id=wid,
        workflow_type="GhostAgent",
        step="ghost_pay#1",
        key=derive_key("default", wid, "ghost_pay#1", "ghost_pay", "1"),
        record_task_queue=tq,
    )
    assert "ghost_pay" not in {t.name for t in exactcall.registered_tools()}
    spec = CallSpec(
        task_queue=None,
        start_to_close_timeout=timedelta(seconds=30),
        heartbeat_timeout=timedelta(seconds=3),
        backoff_coefficient=2.0,
        maximum_interval=None,
    )
    inp = ReconcileInput(
        intent=intent,
        reason="test: unknown",
        since=datetime.now(UTC),
        has_probe=False,
        probe_deadline=timedelta(seconds=5),
        call=spec,
    )
    async with Worker(  # the agents' worker: exactcall's workflows go where workflows run
        client,
        task_queue=tq,
        workflows=[Agent],
        activities=[ghost_pay],
    ):
        await Record(client, intent).claim(Owner(run_id="r", activity_id="a"), 1)
        h = await client.start_workflow(
            RECONCILE_WORKFLOW,
            inp,
            id=reconcile_id(intent.key),
            task_queue=tq,
            result_type=Settled,
        )
        await eventually(
            lambda: reconciliation.state(client, h.id), lambda s: s.phase == "parked", timeout=20
        )
        await h.signal(RESOLVE_SIGNAL, Resolution(verdict="not_landed", by="tester"))
        settled = await h.result()
    assert settled.outcome == "done" and settled.result == {"paid": 5}
    # the input is the compact intent: the key is derived from it, as every reader does
    ran = [
        i
        for i in GHOST_RUNS
        if derive_key(i["namespace"], i["workflow_id"], i["step"], i["tool"], i["tool_version"])
        == intent.key
    ]
    assert len(ran) == 1 and "key" not in ran[0]
