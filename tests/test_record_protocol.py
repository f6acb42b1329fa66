"""The call record's protocol on the happy path and after the record closed by itself.

Per-call records are the slow path (any run of a workflow id but the one that holds its run
claim, or every call with ``Plugin(run_claims=False)``: ``tests/test_run_claim.py`` has the
fast path). The attempt that claims a record writes nothing after the claim: its activity's
completion (in the calling run's history) is the call's done marker, which ``Record.read()``
finds. A record never runs a workflow task: it times out at the end of its lifetime. A marker
written after that (a late refusal, a person's verdict) opens it again, as a new run that
starts from the state so far; the key's first claim time is kept.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from exactcall import reconciliation
from exactcall.activities import Record, _records, _runs
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.workflows import record_id
from tests.conftest import per_call_client, plan, running_worker, start_agent, step
from tests.test_approvals import eventually
from tests.test_calls import scheduled_intents

LIFETIME = timedelta(seconds=1)


@pytest.fixture
def short_lived(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records claimed by this process's worker close 1 s after they are (re)opened."""
    monkeypatch.setattr(_records, "RECORD_LIFETIME", LIFETIME)


async def event_names(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
        async for ev in handle.fetch_history_events()
    ]


async def closed(client: Client, key: str) -> list[str]:
    """The record's latest run, once it has closed (by itself)."""
    handle = client.get_workflow_handle(record_id(key))

    async def status() -> WorkflowExecutionStatus | None:
        return (await handle.describe()).status

    await eventually(status, lambda s: s != WorkflowExecutionStatus.RUNNING, timeout=15)
    return await event_names(handle)


async def runs(client: Client, key: str, at_least: int) -> int:
    """How many runs the record's workflow id has had (visibility: it may lag a little)."""
    query = f"WorkflowId = '{record_id(key)}'"
    counted = await eventually(
        lambda: client.count_workflows(query), lambda c: c.count >= at_least, timeout=15
    )
    return counted.count


async def test_the_claiming_attempt_writes_nothing_more_and_the_record_closes_by_itself(
    server: DevServer, tq: str, bank: Bank, who: str, short_lived: None
) -> None:
    client = await per_call_client(server)
    async with running_worker(client, tq):
        await _claiming_attempt_writes_nothing_more(client, tq, bank, who)
    # the workflow id's run claim names no run: no later run of it takes the fast path
    assert await _runs.holder(client, f"agent-{who}") == ""


async def _claiming_attempt_writes_nothing_more(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)), wid=f"agent-{who}")
    [out] = await handle.result()
    [intent] = await scheduled_intents(client, handle)
    # no marker after the claim, no workflow task: it timed out, which closed it
    assert await closed(client, intent.key) == [
        "WORKFLOW_EXECUTION_STARTED",
        "WORKFLOW_EXECUTION_TIMED_OUT",
    ]
    # what the key says comes from the calling run's completed activity
    view = await Record(client, intent).read()
    assert view is not None and view.closed
    assert view.state.phase == "done" and view.state.result == out["ok"]
    assert "ACTIVITY_TASK_COMPLETED" in await event_names(handle)
    # and a new run of the same workflow id gets that result without paying again
    again = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)), wid=handle.id)
    [out2] = await again.result()
    assert out2["ok"] == out["ok"]
    assert bank.count(to=who) == 1


async def test_a_refusal_after_the_record_closed_opens_it_again_and_the_retry_pays_once(
    per_call: Client, tq: str, bank: Bank, who: str, short_lived: None
) -> None:
    client = per_call
    seconds = 2 * LIFETIME.total_seconds()  # the record has closed when the tool says no
    handle = await start_agent(
        client, tq, plan(step("refuse_late_then_pay", bank.url, 10, who, seconds))
    )
    [out] = await handle.result()
    assert out["ok"]["to"] == who
    [intent] = await scheduled_intents(client, handle)
    view = await Record(client, intent).read()
    assert view is not None and view.state.phase == "done" and view.state.result == out["ok"]
    assert await runs(client, intent.key, at_least=2) >= 2  # opened again at least once
    latest = await client.get_workflow_handle(record_id(intent.key)).describe()
    # the key's first claim time is carried into the new runs
    assert view.since < latest.start_time
    assert bank.count(to=who) == 1


async def test_a_verdict_after_the_record_closed_is_recorded_and_honoured_by_a_new_run(
    per_call: Client, tq: str, bank: Bank, who: str, short_lived: None
) -> None:
    client = per_call
    handle = await start_agent(client, tq, plan(step("pay_then_explode", bank.url, 10, who)))
    rows = await eventually(
        lambda: reconciliation.list_unresolved(client),
        lambda rows: any(r.workflow_id == handle.id for r in rows),
        timeout=30,
    )
    row = next(r for r in rows if r.workflow_id == handle.id)
    await closed(client, row.key)  # the record closed while the call was parked
    receipt = {"payment_id": -7, "checked": "by hand"}
    res = await reconciliation.resolve(
        client, handle.id, row.step, "landed", result=receipt, by="ops"
    )
    assert res.accepted, res
    [out] = await handle.result()
    assert out["ok"] == receipt
    [intent] = await scheduled_intents(client, handle)
    view = await Record(client, intent).read()
    assert view is not None and view.state.phase == "done" and view.state.result == receipt
    assert await runs(client, intent.key, at_least=2) >= 2
    # a new run of the same workflow id: the recorded verdict, not a second payment
    again = await start_agent(
        client, tq, plan(step("pay_then_explode", bank.url, 10, who)), wid=handle.id
    )
    [out2] = await again.result()
    assert out2["ok"] == receipt
    assert bank.count(to=who) == 1
