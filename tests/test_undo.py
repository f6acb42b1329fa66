"""Undo (issue 18 §2): ``@t.undo`` and ``exactcall.saga()``, with every undo's effect counted
at the real local bank (an undo pays the amount back to ``<account>:refund``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

import exactcall
from exactcall._audit import AuditFilter, audit_rows
from exactcall._server import DevServer
from exactcall._worker import build_worker
from exactcall.demo.bank import Bank
from exactcall.testing import WorkerProcess
from tests import undo_app as undo_app
from tests.conftest import ROOT, step
from tests.test_approvals import eventually
from tests.workflows import SagaAgent


def refunds(bank: Bank, who: str) -> list[tuple[int, str | None]]:
    return [(p["amount"], p["memo"]) for p in bank.payments() if p["to_account"] == who + ":refund"]


async def run_saga(client: Client, tq: str, plan: dict[str, Any], wid: str) -> Any:
    return await client.execute_workflow(SagaAgent.run, plan, id=wid, task_queue=tq)


async def _rows(client: Client, wid: str) -> list[dict[str, Any]]:
    return [r async for r in audit_rows(client, AuditFilter(workflow=wid))]


def cause(err: pytest.ExceptionInfo[WorkflowFailureError]) -> ApplicationError:
    c = err.value.cause
    assert isinstance(c, ApplicationError), c
    return c


async def test_an_error_undoes_newest_first_once_across_a_rerun(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    steps = [
        step("saga_pay", bank.url, 10, who),
        step("saga_book", bank.url, 20, who),
        step("saga_notify", bank.url, 5, who),  # no undo declared: skipped
    ]
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, tq, [SagaAgent]):
        with pytest.raises(WorkflowFailureError) as err:
            await run_saga(client, tq, {"steps": steps, "fail": True}, wid)
        assert cause(err).message == "the agent failed after its calls"  # re-raised as it was
        [booking] = [p for p in bank.payments() if p["to_account"] == who and p["amount"] == 20]
        assert refunds(bank, who) == [(20, f"cancel {booking['id']}"), (10, "saga_pay#1")]
        # the audit reads the undo from the history: each undone call, and who undid it
        rows = await eventually(lambda: _rows(client, wid), lambda rows: len(rows) == 5, timeout=15)
        assert {r["step"]: (r["outcome"], r["undone_by"]) for r in rows} == {
            "saga_pay#1": ("undone", "saga_pay#1.undo"),
            "saga_book#1": ("undone", "saga_book#1.undo"),
            "saga_notify#1": ("done", None),
            "saga_pay#1.undo": ("done", None),
            "saga_book#1.undo": ("done", None),
        }
        with pytest.raises(WorkflowFailureError):  # the same workflow id, run again
            await run_saga(client, tq, {"steps": steps, "fail": True}, wid)
    assert refunds(bank, who) == [(20, f"cancel {booking['id']}"), (10, "saga_pay#1")]
    assert bank.count(to=who) == 3


async def test_undo_twice_undoes_once_and_leaving_normally_undoes_nothing(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    steps = [step("saga_pay", bank.url, 10, who), step("saga_notify", bank.url, 5, who)]
    async with build_worker(client, tq, [SagaAgent]):
        kept = await run_saga(client, tq, {"steps": steps}, f"saga-{uuid.uuid4().hex[:8]}")
        assert kept["reports"] == [] and refunds(bank, who) == []
        wid = f"saga-{uuid.uuid4().hex[:8]}"
        out = await run_saga(client, tq, {"steps": steps, "undo": 2}, wid)
    first, second = out["reports"]
    assert first == {
        "undone": ["saga_pay#1"],
        "skipped": ["saga_notify#1"],
        "failed": {},
        "nothing_to_undo": {},
    }
    assert second == first  # nothing ran again
    assert refunds(bank, who) == [(10, "saga_pay#1")]
    assert bank.count(to=who) == 4


async def test_a_failing_undo_does_not_stop_the_others_and_waits_in_unresolved(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    steps = [step("saga_pay", bank.url, 10, who), step("saga_book", bank.url, 20, who)]
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    undo_app.REFUSE_CANCEL.add(who)  # the hotel refuses, for now
    try:
        async with build_worker(client, tq, [SagaAgent]):
            with pytest.raises(WorkflowFailureError) as err:
                await run_saga(client, tq, {"steps": steps, "fail": True}, wid)
            c = cause(err)
            assert c.type == "UndoFailed"
            assert "saga_book#1" in c.message and "this late" in c.message, c.message
            assert "undone: saga_pay#1" in c.message
            assert refunds(bank, who) == [(10, "saga_pay#1")]  # the other undo still ran
            listed = await eventually(
                lambda: _failed_undos(server, wid), lambda rows: len(rows) == 1, timeout=15
            )
            assert (listed[0]["step"], listed[0]["kind"]) == ("saga_book#1", "undo_failed")
            assert "this late" in listed[0]["error"]
            undo_app.REFUSE_CANCEL.discard(who)  # fixed: a person undoes the step
            out = await asyncio.to_thread(_undo_cli, server, wid, "--step", "saga_book#1", "--yes")
            assert out.returncode == 0, out.stdout + out.stderr
            assert out.stdout.splitlines() == ["saga_book#1  undone"]
    finally:
        undo_app.REFUSE_CANCEL.discard(who)
    assert sorted(a for a, _ in refunds(bank, who)) == [10, 20]
    assert await _failed_undos(server, wid) == []  # no longer listed


async def _failed_undos(server: DevServer, wid: str) -> list[dict[str, Any]]:
    out = await asyncio.to_thread(_cli, server, "unresolved", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    return [r for r in rows if r["kind"] == "undo_failed" and r["workflow_id"] == wid]


async def test_unknown_outcomes_are_undone_once_their_reconciliation_says_they_happened(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    # both calls raise AmbiguousOutcome (on_unknown="raise"); the saga waits for each verdict
    steps = [step("saga_lost", bank.url, 10, who), step("saga_flaky", bank.url, 20, who)]
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, tq, [SagaAgent]):
        out = await run_saga(client, tq, {"steps": steps, "undo": 1}, wid)
    assert [o["error"] for o in out["out"]] == ["AmbiguousOutcome", "AmbiguousOutcome"]
    # landed (found by the probe), and not landed then re-run by the reconciliation: both done
    assert out["reports"][0]["undone"] == ["saga_flaky#1", "saga_lost#1"]
    assert bank.count(to=who) == 2  # each paid once
    assert sorted(a for a, _ in refunds(bank, who)) == [10, 20]  # and each undone once


async def test_an_unknown_call_that_never_happened_has_nothing_to_undo(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    steps = [step("saga_declined", bank.url, 30, who)]
    async with build_worker(client, tq, [SagaAgent]):
        out = await run_saga(
            client, tq, {"steps": steps, "undo": 2}, f"saga-{uuid.uuid4().hex[:8]}"
        )
    for report in out["reports"]:  # the second undo() knows it without asking again
        assert report["undone"] == [] and list(report["nothing_to_undo"]) == ["saga_declined#1"]
        assert "card declined" in report["nothing_to_undo"]["saga_declined#1"]
    assert bank.count(to=who) == 0 and refunds(bank, who) == []


def test_undo_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match=r"one argument, the exactcall\.Done"):
        undo_app.saga_notify.undo(lambda done, extra: None)
    reader = exactcall.tool(read_only=True, name="saga_read")(lambda: 1)
    with pytest.raises(TypeError, match="read_only tool cannot declare an undo"):
        reader.undo(lambda done: None)
    with pytest.raises(TypeError, match="already has an undo"):
        undo_app.saga_pay.undo(lambda done: None)


async def test_a_crash_during_the_second_undo_undoes_each_once(
    client: Client, bank: Bank, who: str, tq: str, worker_process: Callable[..., WorkerProcess]
) -> None:
    tools = ["tests.tools", "tests.undo_app"]
    # A is SIGKILLed once the second undo's refund reached the bank; B finishes
    a = worker_process(tq, crash_at="saga_pay.undo:after_call:1", tools=tools)
    await a.started()
    steps = [step("saga_pay", bank.url, 10, who), step("saga_book", bank.url, 20, who)]
    h = await client.start_workflow(
        SagaAgent.run,
        {"steps": steps, "fail": True},
        id=f"saga-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
    )
    assert await a.killed() == -9
    assert len(refunds(bank, who)) == 2  # both undos had reached the bank
    b = worker_process(tq, tools=tools)
    await b.started()
    with pytest.raises(WorkflowFailureError) as err:
        await h.result()
    assert cause(err).message == "the agent failed after its calls"
    assert sorted(a for a, _ in refunds(bank, who)) == [10, 20]  # once each
    assert bank.count(to=who) == 2


def _undo_cli(server: DevServer, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(server, "undo", *args)


def _cli(server: DevServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactcall", *args, "--address", server.address],
        capture_output=True,
        text=True,
        env={**os.environ, "EXACTCALL_LOG_LEVEL": "WARNING"},
        cwd=ROOT,
        timeout=120,
    )


async def test_exactcall_undo_after_the_fact_undoes_each_once(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    steps = [
        step("saga_pay", bank.url, 10, who),
        step("saga_book", bank.url, 20, who),
        step("saga_notify", bank.url, 5, who),
    ]
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, tq, [SagaAgent]):
        await run_saga(client, tq, {"steps": steps}, wid)  # finished: nothing undone
        assert refunds(bank, who) == []
        out = await asyncio.to_thread(_undo_cli, server, wid, "--yes", "--json")
        assert out.returncode == 1, out.stderr  # saga_notify declares no undo
        got = json.loads(out.stdout)
        assert (got["undone"], got["skipped"]) == (["saga_book#1", "saga_pay#1"], ["saga_notify#1"])
        assert sorted(a for a, _ in refunds(bank, who)) == [10, 20]
        again = await asyncio.to_thread(
            _undo_cli, server, wid, "--step", "saga_pay#1", "--step", "saga_book#1", "--yes"
        )
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == ["saga_book#1  undone", "saga_pay#1  undone"]
        assert sorted(a for a, _ in refunds(bank, who)) == [10, 20]  # nothing ran twice

        undone_by_saga = f"saga-{uuid.uuid4().hex[:8]}"
        with pytest.raises(WorkflowFailureError):
            await run_saga(client, tq, {"steps": steps[:1], "fail": True}, undone_by_saga)
        after = await asyncio.to_thread(_undo_cli, server, undone_by_saga, "--yes")
        assert after.returncode == 0, after.stderr
        assert after.stdout.splitlines() == [
            "saga_pay#1  already undone by saga_pay#1.undo in the run"
        ]
    assert sorted(a for a, _ in refunds(bank, who)) == [10, 10, 20]
    bad = await asyncio.to_thread(_undo_cli, server, wid, "--step", "nope#1", "--yes")
    assert bad.returncode == 2 and "not a call of" in bad.stderr, bad.stderr
    none = await asyncio.to_thread(_undo_cli, server, "no-such-workflow", "--yes")
    assert none.returncode == 2 and "no workflow 'no-such-workflow'" in none.stderr, none.stderr
    no_tty = await asyncio.to_thread(_undo_cli, server, wid)
    assert no_tty.returncode == 2 and "--yes" in no_tty.stderr
