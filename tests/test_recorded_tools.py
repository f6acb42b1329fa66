"""``exactcall.testing.recorded_tools``: a real recorded run answers a new run's calls; nothing
reaches the bank (counted there), and a changed argument or step is refused."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory

from exactcall.demo.bank import Bank
from exactcall.testing import NotRecorded, recorded_tools
from tests import audit_app as audit_app
from tests.conftest import plan, running_worker, start_agent, step
from tests.workflows import Uncaught


def _plan(bank: Bank, who: str, second: int = 20) -> dict[str, Any]:
    return plan(
        step("pay", bank.url, 10, who),
        step("balance", bank.url, who),
        step("pay", bank.url, second, who),
        step("declined_pay", bank.url, 5, who),
    )


@pytest.fixture
async def recorded(client: Client, bank: Bank, who: str) -> tuple[WorkflowHistory, list[Any]]:
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, tq):
        h = await start_agent(client, tq, _plan(bank, who))
        out = await h.result()
    assert bank.count(to=who) == 2
    return await h.fetch_history(), out


async def test_a_new_run_is_answered_from_the_recording(
    client: Client, bank: Bank, who: str, tq: str, recorded: Any, tmp_path: Path
) -> None:
    history, out = recorded
    assert out[1] == {"ok": 1} and out[3]["error"] == "ToolFailed"
    path = tmp_path / "run.json"
    path.write_text(history.to_json())
    rt = recorded_tools(path)
    async with running_worker(client, tq, plugins=[rt]):
        again = await (await start_agent(client, tq, _plan(bank, who))).result()
    # the same results, and the same failure (under this run's own key)
    assert again[:3] == out[:3]
    assert again[3]["message"] == out[3]["message"]
    assert again[3]["fields"]["key"] != out[3]["fields"]["key"]
    assert {**again[3]["fields"], "key": None} == {**out[3]["fields"], "key": None}
    assert rt.served == ["pay#1", "balance#1", "pay#2", "declined_pay#1"]
    assert bank.count(to=who) == 2  # zero tool executions

    # a changed argument is refused, naming the change; nothing is paid
    rt = recorded_tools(history)
    async with running_worker(client, tq, plugins=[rt]):
        changed = await (await start_agent(client, tq, _plan(bank, who, second=21))).result()
    assert changed[:2] == out[:2]
    assert changed[2]["error"] == "NotRecorded"
    assert (
        "pay pay#2 differs from the recorded call: amount: 20 -> 21; nothing ran"
        in changed[2]["message"]
    )
    assert bank.count(to=who) == 2


async def test_unrecorded_step_fails_the_run_and_reads_can_run_live(
    client: Client, bank: Bank, who: str, tq: str, recorded: Any
) -> None:
    history, _ = recorded
    rt = recorded_tools(history)
    async with running_worker(client, tq, plugins=[rt]):
        h = await client.start_workflow(
            Uncaught.run,
            {"tool": "counted_send", "args": ["ops", "hello"]},
            id=f"unrecorded-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        with pytest.raises(WorkflowFailureError) as err:
            await h.result()
    cause = err.value.cause
    assert isinstance(cause, NotRecorded) or getattr(cause, "type", None) == "NotRecorded"
    assert "counted_send counted_send#1 is not in the recorded run" in str(cause)
    assert rt.unused == ["pay#1", "balance#1", "pay#2", "declined_pay#1"]

    # read-only tools may run for real: the balance is today's, the payments are recorded
    await _pay_once_more(client, bank, who)
    live = recorded_tools(history, reads="live")
    async with running_worker(client, tq, plugins=[live]):
        out = await (await start_agent(client, tq, _plan(bank, who))).result()
    assert out[1] == {"ok": 3} and live.served == ["pay#1", "pay#2", "declined_pay#1"]
    assert bank.count(to=who) == 3


async def _pay_once_more(client: Client, bank: Bank, who: str) -> None:
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, tq):
        await (await start_agent(client, tq, plan(step("pay", bank.url, 1, who)))).result()


def test_bad_recordings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such history file"):
        recorded_tools(tmp_path / "missing.json")
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="is not a workflow history"):
        recorded_tools(notes)
    with pytest.raises(ValueError, match="reads='sometimes'"):
        recorded_tools(notes, reads="sometimes")  # type: ignore[arg-type]
