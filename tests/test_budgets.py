"""Budgets across calls, on a real server: reservations in the ledger workflow, a person for
an overrun, every release rule, and a SIGKILLed worker mid-run (effects counted at the bank)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.converter import DataConverter

import exactcall
from exactcall import approvals, reconciliation
from exactcall._calls import calls_in_history
from exactcall._wire import BUDGET_WORKFLOW, budget_id
from exactcall._worker import build_worker
from exactcall.budgets._budget import LedgerInput
from exactcall.cli._budgets import view
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows
from exactcall.evidence._replay import replay_histories
from exactcall.testing import WorkerProcess
from tests import budget_app as budget_app
from tests.conftest import ROOT, plan, running_worker, start_agent, step
from tests.test_approvals import eventually
from tests.test_approvals_cli import cli
from tests.test_replay import load
from tests.workflows import Agent


def charges(v: Any) -> dict[str, tuple[float, str]]:
    return {c.step + "@" + c.workflow_id: (c.measure, c.state) for c in v.charges}


async def pending_for(client: Client, wid: str, step_name: str) -> approvals.ApprovalRequest:
    v = await eventually(
        lambda: approvals.view(client, wid),
        lambda v: any(p.step == step_name for p in v.pending),
        timeout=30,
    )
    return next(p for p in v.pending if p.step == step_name)


async def test_refuse_names_the_budget_and_runs_nothing(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    async with running_worker(client, tq):
        h = await start_agent(
            client, tq, plan(*[step("budget_strict", bank.url, 10, who) for _ in range(3)])
        )
        out = await h.result()
        v = await view(client, "test-strict")
        await _cli_lists_budgets_and_charges(server)
    assert [("ok" in o) for o in out] == [True, True, False]
    err = out[2]
    assert err["error"] == "BudgetExceeded"
    assert err["fields"] | {"args_hash": None} == {
        "args_hash": None,
        "budget": "test-strict",
        "limit": 25.0,
        "measure": 10.0,
        "reserved": 0.0,
        "spent": 20.0,
        "step": "budget_strict#3",
        "tool": "budget_strict",
        "window": "all",
    }
    assert "would pass the budget test-strict: 20 spent, this call 10, limit 25" in err["message"]
    assert bank.count(to=who) == 2
    # the audit lists the refused call, with the budget (issue 33 §3)
    rows = [r async for r in audit_rows(client, AuditFilter(workflow=h.id))]
    [row] = [r for r in rows if r["step"] == "budget_strict#3"]
    assert (row["outcome"], row["reason"]) == ("refused", "budget test-strict")
    assert row["error"].startswith("BudgetExceeded: budget_strict budget_strict#3 would pass")
    assert [r["outcome"] for r in rows if r["step"] != "budget_strict#3"] == ["done", "done"]
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(20.0, 0.0, 2)]


async def test_a_loop_budget_asks_a_person_and_counts_across_runs(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    wid = f"loop-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, tq):
        h = await start_agent(
            client, tq, plan(*[step("budget_write", bank.url, i, who) for i in range(1, 6)]), wid
        )
        fourth = await pending_for(client, wid, "budget_write#4")
        assert fourth.reasons == ("budget test-writes-per-run: 3 spent, this call 1, limit 3",)
        # the JSON list carries the reason its text form shows (issue 33 §3)
        rc, out, _ = await cli(server, "approvals", "list", "--json")
        [row] = [r for r in json.loads(out) if r["workflow_id"] == wid]
        assert rc == 0 and row["reasons"] == list(fourth.reasons)
        res = await approvals.deny(
            client, wid, fourth.step, args_hash=fourth.args_hash, by="ops", reason="enough"
        )
        assert res.accepted, res.outcome
        fifth = await pending_for(client, wid, "budget_write#5")
        res = await approvals.approve(client, wid, fifth.step, args_hash=fifth.args_hash, by="ops")
        assert res.accepted, res.outcome
        out = await h.result()
        assert [o.get("error") for o in out] == [None, None, None, "ApprovalDenied", None]
        assert bank.count(to=who) == 4
        v = await view(client, "test-writes-per-run", wid)
        assert [(w.spent, w.reserved, w.calls, w.overruns) for w in v.windows] == [(4.0, 0.0, 4, 1)]
        [over] = [c for c in v.charges if c.overrun]
        assert (over.step, over.approved_by, over.state) == ("budget_write#5", ("ops",), "spent")

        # a new run of the same workflow id counts on: its first write already needs a person
        # (under a step of its own: budget_write#1 again would be the first run's call)
        again = await start_agent(
            client, tq, plan(step("budget_write", bank.url, 99, who, key="later-write")), wid
        )
        req = await pending_for(client, wid, "later-write")
        assert req.reasons == ("budget test-writes-per-run: 4 spent, this call 1, limit 3",)
        await approvals.deny(client, wid, req.step, args_hash=req.args_hash, by="ops")
        assert (await again.result())[0]["error"] == "ApprovalDenied"
        v = await view(client, "test-writes-per-run", wid)
        assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(4.0, 0.0, 4)]
    assert bank.count(to=who) == 4


async def test_what_each_outcome_does_to_its_reservation(
    client: Client, bank: Bank, who: str, tq: str, tmp_path: Path
) -> None:
    async with running_worker(client, tq):
        failed = await start_agent(
            client, tq, plan(step("budget_release_fail", bank.url, 60, who, fail=True))
        )
        assert (await failed.result())[0]["error"] == "ToolFailed"
        landed = await start_agent(
            client,
            tq,
            plan(step("budget_release_unknown", bank.url, 30, who, on_unknown="raise")),
        )
        abandoned = await start_agent(
            client,
            tq,
            plan(step("budget_release_unknown", bank.url, 20, who, on_unknown="raise")),
        )
        for h in (landed, abandoned):
            assert (await h.result())[0]["error"] == "AmbiguousOutcome"
        v = await view(client, "test-release")
        got = charges(v)
        assert got[f"budget_release_fail#1@{failed.id}"] == (60.0, "released")
        assert got[f"budget_release_unknown#1@{landed.id}"] == (30.0, "reserved")
        assert got[f"budget_release_unknown#1@{abandoned.id}"] == (20.0, "reserved")
        # unknown keeps the reservation: 50 of 100 are held, so 60 more is refused
        over = await start_agent(client, tq, plan(step("budget_release_fail", bank.url, 60, who)))
        assert (await over.result())[0]["error"] == "BudgetExceeded"
        reconciliations = []
        for h, verdict in ((landed, "landed"), (abandoned, "abandon")):
            row = await eventually(
                lambda h=h: reconciliation.find(client, h.id, "budget_release_unknown#1"),
                lambda r: r is not None,
                timeout=30,
            )
            res = await reconciliation.resolve(client, h.id, row.step, verdict, by="ops")  # type: ignore[arg-type]
            assert res.accepted, res.outcome
            reconciliations.append(row.reconcile_id)
        v = await eventually(
            lambda: view(client, "test-release"),
            lambda v: not any(c.state == "reserved" for c in v.charges),
            timeout=30,
        )
        got = charges(v)
        assert got[f"budget_release_unknown#1@{landed.id}"] == (30.0, "spent")
        assert got[f"budget_release_unknown#1@{abandoned.id}"] == (20.0, "spent")
        done = await start_agent(client, tq, plan(step("budget_release_fail", bank.url, 50, who)))
        assert "ok" in (await done.result())[0]
        v = await view(client, "test-release")
        assert [(w.spent, w.reserved) for w in v.windows] == [(100.0, 0.0)]
        # two unknown outcomes that landed (30, 20) and one done call (50)
        assert bank.count(to=who) == 3
    # the reconciliations settled the reservations from their own input: they replay in a
    # process that never imported the budgeted tool (a worker of other tools, or the CLI)
    for rid in reconciliations:
        h = client.get_workflow_handle(rid)
        await h.result()
        history = await h.fetch_history()
        assert sum(e.HasField("marker_recorded_event_attributes") for e in history.events) >= 3
        (tmp_path / f"{rid}.json").write_text(json.dumps(history.to_json_dict()))
    out = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "exactcall",
            "replay",
            str(tmp_path),
            "--workflows",
            "tests.workflows",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok ") == 2, out.stdout


async def test_a_ledger_that_continued_as_new_charges_a_rerun_once(
    server: DevServer, client: Client, bank: Bank, who: str, tq: str
) -> None:
    # a ledger continuing as new every few calls (40 events) keeps only its reserved charges
    # whole: the rest are totals and keys, and a re-run of the same calls is charged nothing
    ledger = budget_id("test-compact")
    first = await client.start_workflow(
        BUDGET_WORKFLOW,
        LedgerInput(
            budget="test-compact", scope="namespace", limit=10, per_seconds=None, max_events=40
        ),
        id=ledger,
        task_queue=tq,
    )
    wid = f"compact-{uuid.uuid4().hex[:8]}"
    steps = [step("budget_compact", bank.url, i, who) for i in range(1, 13)]
    async with running_worker(client, tq):
        h = await start_agent(client, tq, plan(*steps), wid)
        for n in (11, 12):  # past the limit: a person says no
            req = await pending_for(client, wid, f"budget_compact#{n}")
            assert req.reasons == ("budget test-compact: 10 spent, this call 1, limit 10",)
            await approvals.deny(client, wid, req.step, args_hash=req.args_hash, by="ops")
        out = await h.result()
        assert [o.get("error") or "ok" for o in out] == ["ok"] * 10 + ["ApprovalDenied"] * 2
        assert (await client.get_workflow_handle(ledger).describe()).run_id != first.result_run_id
        v = await eventually(
            lambda: view(client, "test-compact"),
            lambda v: [w.reserved for w in v.windows] == [0.0],
            timeout=30,
        )
        assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(10.0, 0.0, 10)]
        assert len(v.charges) < 10  # the others are summarised
        again = await start_agent(client, tq, plan(*steps[:10]), wid)  # the same id, again
        assert [o.get("error") or "ok" for o in await again.result()] == ["ok"] * 10
        v = await eventually(
            lambda: view(client, "test-compact"),
            lambda v: [w.reserved for w in v.windows] == [0.0],
            timeout=30,
        )
        assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(10.0, 0.0, 10)]
        show = await asyncio.to_thread(
            subprocess.run,
            [
                *(sys.executable, "-m", "exactcall", "budgets", "show", "test-compact"),
                *("--address", server.address),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "EXACTCALL_LOG_LEVEL": "WARNING"},
            cwd=ROOT,
        )
    assert show.returncode == 0, show.stderr
    assert f"{10 - len(v.charges)} earlier charges of window all are in its totals" in show.stdout
    assert bank.count(to=who) == 10


async def test_cancelled_while_waiting_for_a_person_releases(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    wid = f"loop-cancel-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, tq):
        steps = [step("budget_write", bank.url, i, who) for i in range(1, 5)]
        h = await start_agent(client, tq, plan(*steps), wid)
        await pending_for(client, wid, "budget_write#4")
        await h.cancel()
        with pytest.raises(WorkflowFailureError):
            await h.result()
        v = await view(client, "test-writes-per-run", wid)
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(3.0, 0.0, 3)]
    assert bank.count(to=who) == 3


async def test_bad_measures_are_refused_before_anything_runs(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    async with running_worker(client, tq):
        h = await start_agent(client, tq, plan(step("budget_refund", bank.url, -5, who)))
        out = await h.result()
    assert out[0]["error"] == "InvalidCall"
    msg = out[0]["message"]
    assert "budget 'test-refunds': the measure of this budget_refund call is -5" in msg
    assert bank.count(to=who) == 0


def test_budget_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match="limit=-1"):
        exactcall.Budget("x", limit=-1)
    with pytest.raises(TypeError, match="scope='run'"):
        exactcall.Budget("x", limit=1, scope="run")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a name of letters"):
        exactcall.Budget("has space", limit=1)
    b = exactcall.Budget("day", limit=1, per=timedelta(days=1))
    assert b.window_of(datetime(2026, 12, 2, 23, 59, tzinfo=UTC)) == "2026-12-02T00:00:00Z"
    assert b.window_of(datetime(2026, 12, 3, 0, 0, tzinfo=UTC)) == "2026-12-03T00:00:00Z"
    with pytest.raises(TypeError, match="read_only tool cannot have budgets"):
        exactcall.tool(read_only=True, budgets=[b], name="budget_read")(lambda: 1)
    with pytest.raises(TypeError, match=r"is not an exactcall\.Budget"):
        exactcall.tool(budgets=["day"], name="budget_bad")(lambda: 1)


async def test_a_worker_without_a_workflow_cache_is_refused(client: Client, tq: str) -> None:
    # a reservation is a local activity, which Temporal re-runs without end on such a worker
    with pytest.raises(exactcall.ExactcallError, match="need a workflow cache") as err:
        build_worker(client, tq, [Agent], max_cached_workflows=0)
    assert "budget_refund" in str(err.value)


BUDGET_TOOLS = ("tests.tools", "tests.budget_app")


async def test_thirty_refunds_under_five_thousand_with_a_worker_killed(
    client: Client, bank: Bank, who: str, tq: str, worker_process: Callable[..., WorkerProcess]
) -> None:
    # two workers; A is SIGKILLed right after its first refund reached the bank
    a = worker_process(tq, crash_at="crash_refund:after_call:1", tools=BUDGET_TOOLS)
    b = worker_process(tq, tools=BUDGET_TOOLS)
    await a.started()
    await b.started()
    prefix = f"refunds-{uuid.uuid4().hex[:6]}-"
    handles = await asyncio.gather(
        *(
            start_agent(client, tq, plan(step("crash_refund", bank.url, 200, who)), f"{prefix}{i}")
            for i in range(30)
        )
    )
    assert await a.killed() == -9  # B goes on alone
    waiting = await eventually(
        lambda: approvals.list_pending(client),
        lambda reqs: (
            len([r for r in reqs if r.workflow_id.startswith(prefix)]) == 5
            and bank.count(to=who) == 25
        ),
        timeout=90,
    )
    waiting = [r for r in waiting if r.workflow_id.startswith(prefix)]
    assert bank.count(to=who) == 25  # exactly 25 ran, the crash made none twice
    for r in waiting:  # when it was refused, the other 25 were spent or still reserved
        [why] = r.reasons
        m = re.fullmatch(
            r"budget test-crash-refunds: (\d+) spent(?:, (\d+) reserved)?, this call 200, "
            r"limit 5000",
            why,
        )
        assert m is not None, why
        assert int(m.group(1)) + int(m.group(2) or 0) == 5000, why
    v = await eventually(  # the 25 calls settle their reservations once their results are in
        lambda: view(client, "test-crash-refunds"),
        lambda v: [w.reserved for w in v.windows] == [0.0],
        timeout=30,
    )
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(5000.0, 0.0, 25)]
    assert sum(p["amount"] for p in bank.payments() if p["to_account"] == who) == 5000
    for r in waiting:  # no person says yes: nothing more runs, nothing more is charged
        res = await approvals.deny(client, r.workflow_id, r.step, args_hash=r.args_hash, by="ops")
        assert res.accepted, res.outcome
    outs = [await h.result() for h in handles]
    assert sorted(o[0].get("error") or "ok" for o in outs) == ["ApprovalDenied"] * 5 + ["ok"] * 25
    v = await view(client, "test-crash-refunds")
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(5000.0, 0.0, 25)]
    assert bank.count(to=who) == 25


async def _cli_lists_budgets_and_charges(server: DevServer) -> None:
    env = {**os.environ, "EXACTCALL_LOG_LEVEL": "WARNING"}
    args = ["--address", server.address]
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "exactcall", "budgets", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("test-strict "))
    assert line.split()[1:] == ["namespace", "all", "20", "0", "25", "2", "0"]
    show = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "exactcall", "budgets", "show", "test-strict", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert show.returncode == 0, show.stderr
    assert "test-strict window all: 20 spent, 0 reserved, limit 25, 2 calls" in show.stdout
    assert show.stdout.count(" spent ") >= 2
    missing = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "exactcall", "budgets", "show", "no-such", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert missing.returncode == 2 and "no running ledger of budget 'no-such'" in missing.stderr


async def test_calls_at_once_run_exactly_to_the_limit_with_a_worker_killed_mid_run(
    client: Client, bank: Bank, who: str, tq: str, worker_process: Callable[..., WorkerProcess]
) -> None:
    # n one-call workflows at once (100 here; EXACTCALL_LOAD_CALLS=500 is the figure),
    # each a refund of 10 against a limit of 4n, on two workers; A is SIGKILLed once a tenth
    # of the refunds reached the bank. Exactly 0.4n run; the rest wait with the budget's
    # reason; what the ledger says is spent is what the bank holds
    n = budget_app.LOAD_CALLS
    limit, runs = 4 * n, 4 * n // 10
    a = worker_process(tq, tools=BUDGET_TOOLS)
    b = worker_process(tq, tools=BUDGET_TOOLS)
    await a.started()
    await b.started()
    prefix = f"load-{uuid.uuid4().hex[:6]}-"
    handles = await asyncio.gather(
        *(
            start_agent(client, tq, plan(step("load_refund", bank.url, 10, who)), f"{prefix}{i}")
            for i in range(n)
        )
    )
    await eventually(lambda: _paid(bank, who), lambda c: c >= runs // 4, timeout=60 + n)
    a.kill()
    waiting = await eventually(
        lambda: approvals.list_pending(client),
        lambda reqs: len([r for r in reqs if r.workflow_id.startswith(prefix)]) == n - runs,
        timeout=60 + n,
    )
    waiting = [r for r in waiting if r.workflow_id.startswith(prefix)]
    for r in waiting:
        [why] = r.reasons
        m = re.fullmatch(
            rf"budget test-load: (\d+) spent(?:, (\d+) reserved)?, this call 10, limit {limit}",
            why,
        )
        assert m is not None, why
        assert int(m.group(1)) + int(m.group(2) or 0) == limit, why
    v = await eventually(  # every run that paid has ended: its spend is in the ledger
        lambda: view(client, "test-load"),
        lambda v: [w.reserved for w in v.windows] == [0.0],
        timeout=60 + n,
    )
    assert bank.count(to=who) == runs
    assert sum(p["amount"] for p in bank.payments() if p["to_account"] == who) == limit
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(float(limit), 0.0, runs)]
    for r in waiting:
        res = await approvals.deny(client, r.workflow_id, r.step, args_hash=r.args_hash, by="ops")
        assert res.accepted, res.outcome
    outs = [await h.result() for h in handles]
    assert sorted(o[0].get("error") or "ok" for o in outs) == (
        ["ApprovalDenied"] * (n - runs) + ["ok"] * runs
    )
    v = await view(client, "test-load")
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(float(limit), 0.0, runs)]
    assert bank.count(to=who) == runs


async def _paid(bank: Bank, who: str) -> int:
    return bank.count(to=who)


async def test_a_runs_later_calls_draw_from_its_allowance_and_are_charged_once(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    # twelve sequential calls of one run (the fourth fails without happening): after the
    # first two, the run asks for an allowance and its next calls draw from it, with no
    # ledger operation of their own; the ledger ends with each call charged once, nothing
    # reserved; a re-run of the same workflow id is charged nothing more
    wid = f"ahead-{uuid.uuid4().hex[:8]}"
    steps = [step("budget_ahead", bank.url, 5, who, fail=(i == 3)) for i in range(12)]
    async with running_worker(client, tq):
        h = await start_agent(client, tq, plan(*steps), wid)
        out = await h.result()
        assert [o.get("error") or "ok" for o in out] == ["ok"] * 3 + ["ToolFailed"] + ["ok"] * 8
        v = await eventually(
            lambda: view(client, "test-ahead"),
            lambda v: [w.reserved for w in v.windows] == [0.0],
            timeout=30,
        )
        assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(55.0, 0.0, 11)]
        ops = [
            e.marker_recorded_event_attributes
            async for e in h.fetch_history_events()
            if e.HasField("marker_recorded_event_attributes")
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        ]
        assert len(ops) < 8, len(ops)  # 12 calls: far fewer ledger operations
        again = await start_agent(client, tq, plan(*steps), wid)  # the same id, again
        assert [o.get("error") or "ok" for o in await again.result()][:3] == ["ok"] * 3
        v = await eventually(
            lambda: view(client, "test-ahead"),
            lambda v: [w.reserved for w in v.windows] == [0.0],
            timeout=30,
        )
    assert [(w.spent, w.reserved, w.calls) for w in v.windows] == [(55.0, 0.0, 11)]
    assert bank.count(to=who) == 11


@pytest.mark.parametrize("verdict", ["landed", "abandon"])
async def test_a_drawn_call_whose_outcome_is_unknown_stays_reserved_until_its_verdict(
    client: Client, bank: Bank, who: str, tq: str, verdict: str
) -> None:
    # two calls reserve in the ledger (the second asks for an allowance); the third draws
    # from it, and its answer is lost (unknown; on_unknown="raise", so the run ends): the run
    # reports it reserved under its own key, gives the rest of its allowance back, and the
    # verdict settles it like any reserved call
    wid = f"ahead-unknown-{verdict}-{uuid.uuid4().hex[:6]}"
    steps = [step("ahead_pay", bank.url, 10, who) for _ in range(2)]
    steps.append(step("ahead_lost", bank.url, 10, who, on_unknown="raise"))
    async with running_worker(client, tq):
        h = await start_agent(client, tq, plan(*steps), wid)
        out = await h.result()
        assert [o.get("error") or "ok" for o in out] == ["ok", "ok", "AmbiguousOutcome"]
        v = await eventually(
            lambda: view(client, "test-ahead-unknown"),
            lambda v: (
                charges(v).get(f"ahead_lost#1@{wid}") == (10.0, "reserved")
                and charges(v).get(f"(allowance)@{wid}", (0, "released"))[1] == "released"
            ),
            timeout=30,
        )
        assert charges(v)[f"ahead_pay#2@{wid}"] == (10.0, "spent")
        row = await eventually(
            lambda: reconciliation.find(client, wid, "ahead_lost#1"),
            lambda r: r is not None,
            timeout=30,
        )
        res = await reconciliation.resolve(client, wid, row.step, verdict, by="ops")  # type: ignore[arg-type]
        assert res.accepted, res.outcome
        state = "spent"  # landed, or abandoned: it may have happened, the charge stands
        v = await eventually(
            lambda: view(client, "test-ahead-unknown"),
            lambda v: charges(v).get(f"ahead_lost#1@{wid}") == (10.0, state),
            timeout=30,
        )
    mine = [c for c in v.charges if c.workflow_id == wid]
    assert not [c for c in mine if c.state == "reserved"], mine
    assert sum(c.measure for c in mine if c.state == "spent") == 30.0
    assert bank.count(to=who) == 3  # two payments and the one whose answer was lost


async def test_a_verdict_that_reaches_the_ledger_before_the_drawn_call_is_reported(
    client: Client, bank: Bank, who: str, tq: str
) -> None:
    # the drawn call's answer is lost and the run goes on to wait for a person (so it reports
    # nothing yet); the verdict (landed) reaches the ledger first, and is applied when the
    # run, approved, ends and reports the call
    wid = f"ahead-early-{uuid.uuid4().hex[:6]}"
    steps = [step("ahead_pay", bank.url, 10, who) for _ in range(2)]
    steps.append(step("ahead_lost", bank.url, 10, who, on_unknown="raise"))
    steps.append(step("transfer", bank.url, 1, who))
    async with running_worker(client, tq):
        h = await start_agent(client, tq, plan(*steps), wid)
        req = await pending_for(client, wid, "transfer#1")
        row = await eventually(
            lambda: reconciliation.find(client, wid, "ahead_lost#1"),
            lambda r: r is not None,
            timeout=30,
        )
        res = await reconciliation.resolve(client, wid, row.step, "landed", by="ops")
        assert res.accepted, res.outcome
        # the reconciliation ends once its settle is in the ledger's history (before any
        # report of the run's): the ledger has no charge of that key yet
        await client.get_workflow_handle(row.reconcile_id).result()
        assert f"ahead_lost#1@{wid}" not in charges(await view(client, "test-ahead-unknown"))
        await approvals.approve(client, wid, req.step, args_hash=req.args_hash, by="ops")
        out = await h.result()
        assert [o.get("error") or "ok" for o in out] == ["ok", "ok", "AmbiguousOutcome", "ok"]
        v = await eventually(
            lambda: view(client, "test-ahead-unknown"),
            lambda v: f"ahead_lost#1@{wid}" in charges(v),
            timeout=30,
        )
    assert charges(v)[f"ahead_lost#1@{wid}"] == (10.0, "spent")
    mine = [c for c in v.charges if c.workflow_id == wid]
    assert not [c for c in mine if c.state == "reserved"], mine


async def test_a_history_from_before_the_tool_had_budgets_replays() -> None:
    # recorded by tests/budget_v1.py (no budgets=); budget_app's budget_late has one now: the
    # recorded call took the path without reservations (BUDGETS_PATCH), and replays so
    path = ROOT / "tests" / "histories" / "budget" / "before_budgets.json"
    [report] = await replay_histories([path], [Agent])
    assert report.ok, report.problems
    assert report.calls == 1


@pytest.mark.parametrize("name", ["refused_before_recorded", "refused_recorded"])
async def test_runs_with_a_refused_call_replay(name: str) -> None:
    # before exactcall.budget-refusals-recorded a refusal left no trace in the run; since, it
    # is in the run's memo, and the audit reads it from the history
    path = ROOT / "tests" / "histories" / "budget" / f"{name}.json"
    [report] = await replay_histories([path], [Agent])
    assert report.ok, report.problems
    history = load(path)
    calls = await calls_in_history(history, DataConverter.default)
    refused = [c.step for c in calls if c.outcome == "refused"]
    assert refused == ([] if name == "refused_before_recorded" else ["budget_strict#3"])


async def test_a_call_in_flight_across_the_deploy_finishes_once_uncharged(
    client: Client, bank: Bank, who: str, tq: str, worker_process: Callable[..., WorkerProcess]
) -> None:
    # the old worker (no budgets) dies right after the bank booked the payment; the new one,
    # whose tool has a budget, finishes the call from its history: one payment, no charge
    old = worker_process(tq, crash_at="budget_late:after_call:1", tools=["tests.budget_v1"])
    await old.started()
    h = await start_agent(client, tq, plan(step("budget_late", bank.url, 40, who)))
    assert await old.killed() == -9
    assert bank.count(to=who) == 1
    async with running_worker(client, tq):
        [out] = await h.result()
        assert "ok" in out, out
        later = await start_agent(client, tq, plan(step("budget_late", bank.url, 5, who)))
        assert "ok" in (await later.result())[0]  # a call after the deploy is charged
        v = await view(client, "test-late")
    assert [(w.spent, w.calls) for w in v.windows] == [(5.0, 1)]
    assert bank.count(to=who) == 2


@pytest.mark.parametrize(
    "name",
    [
        "settled_at_once",
        "ledger_updates",
        "spends_carried",
        "ledger_batches",
        "allowances",
        "ledger_allowances",
    ],
)
async def test_runs_and_ledgers_of_both_reservation_paths_replay(name: str) -> None:
    # settled_at_once and ledger_updates: recorded when every reservation was its own Update
    # and every outcome settled at once; spends_carried and ledger_batches: the same run since
    # exactcall.budget-spends-carried (batched operations, a spend carried by the next
    # reservation). Callers (two done calls, one released) and ledgers replay on today's code
    path = ROOT / "tests" / "histories" / "budget" / f"{name}.json"
    [report] = await replay_histories([path], [Agent])
    assert report.ok, report.problems
    assert report.calls == (0 if name.startswith("ledger") else 6 if name == "allowances" else 3)
