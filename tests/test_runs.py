"""Once per key across runs: reset, a new run under the same workflow id, continue-as-new."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from exactcall.demo.bank import Bank
from tests.conftest import plan, start_agent, step
from tests.workflows import Rounds


async def reset_to(client: Client, handle: WorkflowHandle[Any, Any], event_id: int) -> str:
    """Reset the workflow to the end of the workflow task completed at ``event_id``."""
    resp = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=handle.id),
            reason="test reset",
            workflow_task_finish_event_id=event_id,
            request_id=str(uuid.uuid4()),
        )
    )
    return resp.run_id


async def completed_tasks(handle: WorkflowHandle[Any, Any]) -> list[int]:
    """Event ids of the run's WorkflowTaskCompleted events."""
    return [
        ev.event_id
        async for ev in handle.fetch_history_events()
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]


async def reset_to_first_task(client: Client, handle: WorkflowHandle[Any, Any]) -> str:
    """Reset the workflow to its first completed workflow task; returns the new run id."""
    [first, *_] = await completed_tasks(handle)
    return await reset_to(client, handle, first)


async def test_reset_after_the_effect_returns_the_recorded_result(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(
        client,
        tq,
        plan(step("pay", bank.url, 10, who), step("charge", bank.url, 20, who), fail_after=True),
    )
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    first = await _last_outcomes(client, handle)
    assert bank.count(to=who) == 2

    new_run = await reset_to_first_task(client, handle)
    assert new_run != handle.result_run_id
    with pytest.raises(WorkflowFailureError):
        await client.get_workflow_handle(handle.id, run_id=new_run).result()
    assert bank.count(to=who) == 2  # the reset run re-ran both calls: nothing was paid again
    again = await _last_outcomes(client, client.get_workflow_handle(handle.id, run_id=new_run))
    assert again == first


async def test_new_run_same_id_same_args_returns_recorded_different_args_conflicts(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"agent-{uuid.uuid4().hex[:8]}"
    h1 = await start_agent(client, tq, plan(step("pay", bank.url, 10, who), fail_after=True), wid)
    with pytest.raises(WorkflowFailureError):
        await h1.result()
    receipt = (await _last_outcomes(client, h1))[0]

    # the agent is started again under the same workflow id (a retry of the whole job)
    out = await (await start_agent(client, tq, plan(step("pay", bank.url, 10, who)), wid)).result()
    assert out[0]["ok"] == receipt
    assert bank.count(to=who) == 1

    # ... and again, but the model now decided something else for the same step
    h3 = await start_agent(client, tq, plan(step("pay", bank.url, 9999, "mallory")), wid)
    out = await h3.result()
    assert out[0]["error"] == "IntentConflict"
    assert out[0]["fields"]["recorded_hash"] != out[0]["fields"]["args_hash"]
    assert bank.count(to="mallory") == 0
    assert bank.count(to=who) == 1


async def test_continue_as_new_carries_the_ordinals(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await client.start_workflow(
        Rounds.run, args=[bank.url, who, 3, []], id=f"rounds-{uuid.uuid4().hex[:8]}", task_queue=tq
    )
    assert await handle.result() == ["whoami#1", "whoami#2", "whoami#3"]
    assert bank.count(to=who) == 3


async def test_reset_while_the_old_run_is_still_paying_does_not_pay_twice(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("slow_pay", bank.url, 5, who, 1.0)))
    for _ in range(200):  # until the old run's attempt has paid (and is still running)
        if bank.count(to=who):
            break
        await asyncio.sleep(0.02)
    new_run = await reset_to_first_task(client, handle)
    out = await client.get_workflow_handle(handle.id, run_id=new_run).result()
    # the old attempt finishes within the new attempt's grace period and records its result
    assert "ok" in out[0], out
    assert bank.count(to=who) == 1


async def _last_outcomes(client: Client, handle: WorkflowHandle[Any, Any]) -> list[Any]:
    """Results of the tool activities of a (failed) run, from its history."""
    out = []
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            payloads = ev.activity_task_completed_event_attributes.result.payloads
            [value] = await client.data_converter.decode(payloads)
            out.append(value)
    return out
