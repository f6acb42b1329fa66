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
from exactcall._canonical import derive_key
from exactcall._worker import build_worker
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows
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
        assert again.stdout.splitlines() == [  # it sees the undos it made before
            "saga_pay#1  already undone by saga_pay#1.undo, made by exactcall undo",
            "saga_book#1  already undone by saga_book#1.undo, made by exactcall undo",
        ]
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


def _refund_keys(bank: Bank, who: str) -> list[str | None]:
    return [p["idempotency_key"] for p in bank.payments() if p["to_account"] == who + ":refund"]


async def test_exactcall_undo_and_the_saga_make_one_undo_under_one_key(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    # issue 33 §1: the undo made by the CLI and the one the run's saga makes are one call
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    steps = [step("saga_pay", bank.url, 10, who)]
    async with build_worker(client, tq, [SagaAgent]):
        await run_saga(client, tq, {"steps": steps}, wid)
        out = await asyncio.to_thread(_undo_cli, server, wid, "--yes")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines() == ["saga_pay#1  undone"]
        key = derive_key("default", wid, "saga_pay#1.undo", "saga_pay.undo", "1")
        assert _refund_keys(bank, who) == [key]  # the key the run's own saga would give it
        # the same workflow id again, and its saga undoes: the record says it is made
        with pytest.raises(WorkflowFailureError):
            await run_saga(client, tq, {"steps": steps, "fail": True}, wid)
    assert _refund_keys(bank, who) == [key]
    assert bank.count(to=who) == 1


async def _through_a_crash(
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    crash_at: str,
    plan: dict[str, Any],
) -> tuple[str, Any]:
    """Start a saga on a worker SIGKILLed at ``crash_at``; a second worker takes over."""
    tools = ["tests.tools", "tests.undo_app"]
    a = worker_process(tq, crash_at=crash_at, tools=tools)
    await a.started()
    wid = f"saga-{uuid.uuid4().hex[:8]}"
    h = await client.start_workflow(SagaAgent.run, plan, id=wid, task_queue=tq)
    assert await a.killed() == -9
    await worker_process(tq, tools=tools).started()
    return wid, h


async def test_an_undo_settled_by_its_probe_after_a_crash_is_not_made_again(
    server: DevServer,
    client: Client,
    bank: Bank,
    who: str,
    tq: str,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    # issue 33 §1: the saga's undo is cut by a SIGKILL after its effect and settled as landed
    # by its probe; `exactcall undo` afterwards must see it, not refund again
    plan = {"steps": [step("saga_charge", bank.url, 10, who)], "fail": True}
    wid, h = await _through_a_crash(
        client, worker_process, tq, "saga_charge.undo:after_call:1", plan
    )
    with pytest.raises(WorkflowFailureError):
        await h.result()
    assert len(refunds(bank, who)) == 1
    out = await asyncio.to_thread(_undo_cli, server, wid, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "saga_charge#1  already undone by saga_charge#1.undo in the run"
    ]
    assert len(refunds(bank, who)) == 1
    rows = await eventually(lambda: _rows(client, wid), lambda rows: len(rows) == 2, timeout=15)
    assert {r["step"]: (r["outcome"], r["undone_by"]) for r in rows} == {
        "saga_charge#1": ("undone", "saga_charge#1.undo"),  # linked to its reconciled undo
        "saga_charge#1.undo": ("done", None),
    }


async def test_a_call_settled_as_landed_is_undone_and_a_read_is_no_failure(
    server: DevServer,
    client: Client,
    bank: Bank,
    who: str,
    tq: str,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    # issue 33 §1: a call whose worker died after the effect, settled landed by its probe, is
    # undone like a done one; a read-only call has nothing to undo and is not a failure
    plan = {"steps": [step("saga_look", bank.url, who), step("saga_charge", bank.url, 7, who)]}
    wid, h = await _through_a_crash(client, worker_process, tq, "saga_charge:after_call:1", plan)
    await h.result()
    assert bank.count(to=who) == 1 and refunds(bank, who) == []
    out = await asyncio.to_thread(_undo_cli, server, wid, "--yes", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert (got["undone"], got["reads"], got["not_undone"]) == (
        ["saga_charge#1"],
        ["saga_look#1"],
        {},
    )
    assert refunds(bank, who) == [(7, "saga_charge#1")]
    again = await asyncio.to_thread(_undo_cli, server, wid, "--step", "saga_charge#1", "--yes")
    assert again.returncode == 0, again.stderr
    assert refunds(bank, who) == [(7, "saga_charge#1")]


def test_the_undo_plan_says_why_each_call_is_or_is_not_undone() -> None:
    from datetime import UTC, datetime

    from exactcall._calls import RunCall
    from exactcall.undo._plan import plan_undo

    def c(step: str, outcome: str, run: str = "r1") -> RunCall:
        return RunCall(
            workflow_id="w",
            run_id=run,
            workflow_type="A",
            step=step,
            tool=step.split("#")[0],
            args={},
            args_hash="h",
            key="k-" + step,
            time=datetime.now(UTC),
            outcome=outcome,
        )

    calls = [
        c("a#1", "done"),  # never undone: to do
        c("b#1", "done"),  # its undo ran elsewhere and is done
        c("u#1", "unknown"),  # no verdict yet
        c("f#1", "failed"),  # did not happen
        c("x#1", "done"),  # its undo's outcome is unknown
        c("y#1", "done"),  # its undo failed: made again, under the same key
        c("r#1", "running"),
    ]
    undos = [
        c("b#1.undo", "failed", "r0"),
        c("b#1.undo", "done", "r2"),
        c("x#1.undo", "unknown", "r2"),
        c("y#1.undo", "failed", "r2"),
    ]
    plan = plan_undo("w", calls, undos)
    assert [t.step for t in plan.todo] == ["a#1", "y#1"]
    assert plan.already == {"b#1": "b#1.undo, made by exactcall undo"}
    assert plan.nothing == {"f#1": "failed"}
    assert set(plan.blocked) == {"u#1", "x#1", "r#1"}
    assert "exactcall resolve w u#1 --landed" in plan.blocked["u#1"]
    assert "exactcall resolve w x#1.undo --landed" in plan.blocked["x#1"]
    assert [t.step for t in plan_undo("w", calls, undos, ["a#1"]).todo] == ["a#1"]


@pytest.mark.parametrize("name", ["cli_undo", "cli_undo_keys_of_the_run"])
async def test_stored_undo_runs_replay(name: str) -> None:
    # cli_undo: each undo a call of the undo workflow's own id, from before
    # exactcall.undo-keys-of-the-run; the other, each a call of the undone workflow's id
    from temporalio.worker import Replayer

    from tests.test_replay import HISTORIES, load

    replayer = Replayer(
        workflows=[],
        plugins=[exactcall.Plugin(tools=[undo_app.saga_pay, undo_app.saga_notify])],
        namespace="default",
    )
    await replayer.replay_workflow(load(HISTORIES / "undo" / f"{name}.json"))
