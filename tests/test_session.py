"""exactcall.session: guarded calls from code that is not a workflow, against a real dev
server, a real bank (payments counted where they land) and real processes killed with
SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Replayer

import exactcall
from exactcall._wire import session_call_id
from exactcall.approvals import approve, list_pending
from exactcall.cli._main import main as cli_main
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows
from exactcall.evidence._diff import calls_of, diff_calls
from exactcall.session._lock import SessionLock
from exactcall.session._workflow import SessionCall
from tests.conftest import ROOT
from tests.session_app import (
    DIE_ENV,
    SessionInsideAWorkflow,
    session_pay,
    session_pay_approved,
    session_pay_budgeted,
    session_pay_plain,
    session_pay_typed,
)
from tests.test_replay import load
from tests.undo_app import saga_pay

pytestmark = pytest.mark.asyncio
HISTORIES = ROOT / "tests" / "histories" / "session"


def sid() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"


def run_app(
    server: DevServer | None, *args: str, die: int | None = None, home: Path | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    if server is not None:
        env.update(TEMPORAL_ADDRESS=server.address, TEMPORAL_NAMESPACE="default")
    if home is not None:
        env["EXACTCALL_HOME"] = str(home)
    env.pop(DIE_ENV, None)
    if die is not None:
        env[DIE_ENV] = str(die)
    return subprocess.run(
        [sys.executable, "-m", "tests.session_app", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def receipts(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_a_process_that_starts_again_from_the_top_pays_nothing_twice(
    client: Client, bank: Bank, who: str
) -> None:
    s_id = sid()
    async with exactcall.session(s_id, client=client) as s:
        first = [await s.call(session_pay, bank.url, n, who) for n in (10, 20)]
    assert bank.count(who) == 2
    async with exactcall.session(s_id, client=client) as s:  # the same program, again
        again = [await s.call(session_pay, bank.url, n, who) for n in (10, 20)]
        assert again == first  # each step's recorded result
        assert bank.count(who) == 2
        repeat = await s.call(session_pay, bank.url, 10, who, key="second-payment")
        assert repeat["payment_id"] != first[0]["payment_id"]
    assert bank.count(who) == 3
    async with exactcall.session(s_id, client=client) as s:
        with pytest.raises(exactcall.IntentConflict, match=r"step 'session_pay#1'.*Nothing was"):
            await s.call(session_pay, bank.url, 99, who)  # other arguments at step pay#1
    assert bank.count(who) == 3


async def test_a_process_killed_after_the_payment_leaves_it_to_temporal(
    server: DevServer, bank: Bank, who: str
) -> None:
    s_id = sid()
    killed = run_app(server, s_id, bank.url, who, die=20)
    assert killed.returncode == -9, killed.stderr
    assert len(receipts(killed.stdout)) == 1  # paid 10, then 20 and was killed
    assert bank.count(who) == 2
    again = run_app(server, s_id, bank.url, who)  # starts again from the top
    assert again.returncode == 0, again.stderr
    r10, r20 = receipts(again.stdout)
    assert r10 == receipts(killed.stdout)[0]  # recorded: not paid again
    assert r20["found_by"] == "probe"  # the unknown outcome's verdict: landed
    assert bank.count(who) == 2  # plain Python would have paid 4 times by now


async def test_without_a_configured_temporal_a_session_uses_the_embedded_server(
    bank: Bank, who: str, tmp_path: Path
) -> None:
    s_id = sid()
    first = await asyncio.to_thread(run_app, None, s_id, bank.url, who, home=tmp_path)
    assert first.returncode == 0, first.stderr
    again = await asyncio.to_thread(run_app, None, s_id, bank.url, who, home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert receipts(again.stdout) == receipts(first.stdout)  # kept in its database
    assert bank.count(who) == 2
    assert (tmp_path / "mcp" / "temporal.db").exists()


async def test_a_plain_tool_killed_after_the_payment_is_unknown_never_re_sent(
    server: DevServer, client: Client, bank: Bank, who: str
) -> None:
    s_id = sid()
    killed = run_app(server, s_id, bank.url, who, "session_pay_plain", die=10)
    assert killed.returncode == -9, killed.stderr
    again = run_app(server, s_id, bank.url, who, "session_pay_plain")
    assert again.returncode == 3, again.stderr
    [error] = receipts(again.stdout)
    assert error["error"] == "AmbiguousOutcome"  # its verdict waits for a person
    assert "exactcall unresolved" in error["message"]
    assert bank.count(who) == 1  # never re-sent
    # the call waits for a person's verdict; `exactcall resolve` (by the call's workflow id)
    # gives it, and the session's call at that step gets it
    async with exactcall.session(s_id, client=client) as s:
        waiting = asyncio.ensure_future(s.call(session_pay_plain, bank.url, 10, who))
        wid, step = session_call_id(s_id, "session_pay_plain#1"), "session_pay_plain#1"
        argv = ["resolve", wid, step, "--landed", "--result", '{"paid": "by hand"}', "--yes"]
        for _ in range(100):  # (listed once its reconciliation has parked)
            code = await asyncio.to_thread(cli_main, [*argv, "--address", server.address])
            if code == 0:
                break
            await asyncio.sleep(0.2)
        assert await waiting == {"paid": "by hand"}
    assert bank.count(who) == 1


async def test_an_approval_waits_and_wait_false_raises_the_approve_command(
    client: Client, bank: Bank, who: str
) -> None:
    s_id = sid()
    async with exactcall.session(s_id, client=client) as s:
        with pytest.raises(exactcall.ApprovalPending) as info:
            await s.call(session_pay_approved, bank.url, 10, who, wait=False)
        err = info.value
        assert err.step == "session_pay_approved#1"
        assert f"exactcall approve '{err.workflow_id}' 'session_pay_approved#1'" in err.command
        listed = {(r.workflow_id, r.step) for r in await list_pending(client)}
        assert (err.workflow_id, err.step) in listed
        assert bank.count(who) == 0
        waiting = asyncio.ensure_future(
            s.call(session_pay_approved, bank.url, 10, who, key=err.step)
        )
        await approve(client, err.workflow_id, err.step, args_hash=err.args_hash, by="test")
        receipt = await waiting
    assert receipt["amount"] == 10
    assert bank.count(who) == 1


async def test_a_result_has_the_tools_return_type_when_made_and_when_recorded(
    client: Client, bank: Bank, who: str
) -> None:
    s_id = sid()
    for _ in range(2):  # made, then the recorded result
        async with exactcall.session(s_id, client=client) as s:
            receipt = await s.call(session_pay_typed, bank.url, 5, who)
        assert type(receipt).__name__ == "Receipt" and receipt.amount == 5
    assert bank.count(who) == 1


async def test_a_budget_counts_session_calls(client: Client, bank: Bank, who: str) -> None:
    async with exactcall.session(sid(), client=client) as s:
        await s.call(session_pay_budgeted, bank.url, 10, who)
        with pytest.raises(exactcall.BudgetExceeded, match="session-test"):
            await s.call(session_pay_budgeted, bank.url, 10, who)
    assert bank.count(who) == 1


async def test_two_live_processes_in_one_session_are_refused(
    server: DevServer, client: Client, bank: Bank, who: str
) -> None:
    s_id = sid()
    async with exactcall.session(s_id, client=client):
        with pytest.raises(exactcall.SessionBusy, match="already open in this process"):
            async with exactcall.session(s_id, client=client):
                pass
        other = await asyncio.to_thread(run_app, server, s_id, bank.url, who)
        assert other.returncode == 1
        assert f"SessionBusy: exactcall.session('{s_id}'): session is in use by process " in (
            other.stderr
        )
        assert f"process {os.getpid()} on" in other.stderr
    assert bank.count(who) == 0
    async with exactcall.session(s_id, client=client):  # closed: free again at once
        pass


async def test_bad_use_is_a_clear_error(client: Client, bank: Bank, who: str) -> None:
    def not_a_tool(amount: int) -> None: ...

    async with exactcall.session(sid(), client=client) as s:
        with pytest.raises(exactcall.UnknownTool, match="not an exactcall tool"):
            await s.call(not_a_tool, 10)
        with pytest.raises(exactcall.InvalidCall):
            await s.call(session_pay, bank.url, "ten", who)
    with pytest.raises(exactcall.ExactcallError, match="not open"):
        await s.call(session_pay, bank.url, 10, who)
    assert bank.count(who) == 0


async def test_a_session_inside_a_workflow_says_to_use_exactcall_call(
    client: Client, exactcall_worker: Any, exactcall_task_queue: str
) -> None:
    async with exactcall_worker(workflows=[SessionInsideAWorkflow]):
        handle = await client.start_workflow(
            SessionInsideAWorkflow.run, id=sid(), task_queue=exactcall_task_queue
        )
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
    assert "inside a workflow use exactcall.call(tool, ...)" in str(info.value.cause)


async def test_audit_diff_and_undo_see_session_calls(
    server: DevServer, client: Client, bank: Bank, who: str
) -> None:
    a, b = sid(), sid()
    async with exactcall.session(b, client=client) as s:
        for n in (10, 25):
            await s.call(saga_pay, bank.url, n, who)
    async with exactcall.session(a, client=client) as s:
        for n in (10, 20):
            await s.call(saga_pay, bank.url, n, who)
        rows = [r async for r in audit_rows(client, AuditFilter(workflow=a))]
        assert sorted((r["step"], r["outcome"]) for r in rows) == [
            ("saga_pay#1", "done"),
            ("saga_pay#2", "done"),
        ]
        conv = client.data_converter
        d = diff_calls(
            await calls_of(f"session:{a}", conv, client),
            await calls_of(f"session:{b}", conv, client),
        )
        assert sorted((x.step, x.status) for x in d.steps) == [
            ("saga_pay#1", "same"),
            ("saga_pay#2", "changed"),
        ]
        # exactcall undo of a session call: run by the session's worker, once
        wid = session_call_id(a, "saga_pay#2")
        for _ in range(2):
            argv = ["undo", wid, "--yes", "--address", server.address]
            assert await asyncio.to_thread(cli_main, argv) == 0
    assert bank.count(f"{who}:refund") == 1
    assert bank.count(who) == 4


@pytest.mark.parametrize(
    "name", ["session_call", "session_approved_call", "session_lock"]
)  # tests/make_histories.py
async def test_stored_session_histories_replay(name: str) -> None:
    replayer = Replayer(
        workflows=[SessionCall, SessionLock],
        plugins=[exactcall.Plugin(tools=[])],
        namespace="default",
    )
    await replayer.replay_workflow(load(HISTORIES / f"{name}.json"))
