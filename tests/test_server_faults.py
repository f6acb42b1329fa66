"""The Temporal server SIGKILLed and restarted on its database file (issue 36 §2), with calls
before their tool, inside it before the effect, inside it after the effect, waiting for a
person's approval and parked as unknown; two worker processes. A dev server of the test's own
(not the session's): the kill must not touch the other tests. Payments are counted at the
real local HTTP bank: one per call, every call ends, approvals keep their hashes, and the
workers reconnect by themselves (a worker that fail-stopped, its claim lost while a sync tool
ran, is started again as a supervisor would)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

import tests.fault_tools  # noqa: F401  (the tools' module, for the worker processes)
from exactcall import approvals, reconciliation
from exactcall._worker import Connection, connect
from exactcall.activities._cancelling import FAIL_STOP_EXIT
from exactcall.demo.bank import Bank
from exactcall.testing import DevServer, EffectCounter, WorkerProcess, free_port
from tests.conftest import ROOT, plan, start_agent, step
from tests.test_approvals import eventually

pytestmark = pytest.mark.crash

TOOLS = ["tests.fault_tools", "tests.tools"]


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[DevServer]:
    with DevServer(db=tmp_path / "temporal.db", port=free_port()) as server:
        yield server


class Fleet:
    """Two worker processes on one task queue; ``replace_stopped()`` is the supervisor."""

    def __init__(self, server: DevServer, tq: str) -> None:
        self.server, self.tq = server, tq
        self.workers = [self._start(n) for n in ("a", "b")]
        self.replaced = 0

    def _start(self, name: str) -> WorkerProcess:
        return WorkerProcess(
            self.server.address, self.tq, tools=TOOLS, workflows=["tests.workflows"], cwd=ROOT
        )

    async def started(self) -> None:
        for w in self.workers:
            await w.started()

    def replace_stopped(self) -> None:
        for i, w in enumerate(self.workers):
            code = w.proc.poll()
            if code is not None:
                assert code == FAIL_STOP_EXIT, (code, w.tail)  # never a crash of another kind
                w.stop()
                self.workers[i] = self._start(w.name)
                self.replaced += 1

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


async def new_client(server: DevServer) -> Client:
    return await connect(Connection(address=server.address, namespace="default"))


async def test_server_killed_and_restarted_every_call_ends_once(
    own_server: DevServer, bank: Bank, who: str, tq: str, effects: EffectCounter
) -> None:
    # down longer than the tools' heartbeat timeout (2 s): every attempt in a tool loses its
    # claim (a restart at once is often as long: 0.3-1.1 s to start, then the reconnection)
    down = 3.0
    server = own_server
    client = await new_client(server)
    fleet = Fleet(server, tq)
    url = bank.url
    inside = {  # in the tool, before the effect, when the server dies
        "probe-async": step("fault_book_async", url, 10, f"{who}-pa", 3.0),
        "probe-sync": step("fault_book_sync_checked", url, 10, f"{who}-ps", 3.0),
        "idempotent": step("fault_charge", url, 10, f"{who}-pi", 3.0),
    }
    try:
        await fleet.started()
        handles: dict[str, WorkflowHandle[Any, Any]] = {}
        # parked as unknown: the tool paid, then raised (no probe)
        handles["unknown"] = await start_agent(
            client, tq, plan(step("pay_then_explode", url, 10, f"{who}-un"))
        )
        handles["approval"] = await start_agent(
            client, tq, plan(step("transfer", url, 10, f"{who}-ap"))
        )
        try:
            parked = await eventually(
                lambda: reconciliation.list_unresolved(client),
                lambda rows: any(r.workflow_id == handles["unknown"].id for r in rows),
                timeout=30,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; workers: {[w.tail for w in fleet.workers]}") from None
        [row] = [r for r in parked if r.workflow_id == handles["unknown"].id]
        view = await eventually(
            lambda: approvals.view(client, handles["approval"].id), lambda v: len(v.pending) == 1
        )
        [asked] = view.pending
        for name, s in inside.items():
            handles[name] = await start_agent(client, tq, plan(s))
        # after the effect: paid, still inside the tool (a plain tool: no probe)
        handles["after-effect"] = await start_agent(
            client, tq, plan(step("slow_pay", url, 10, f"{who}-ae", 3.0))
        )
        await eventually(
            lambda: asyncio.sleep(0, effects.count()), lambda n: n == len(inside), timeout=30
        )
        await eventually(
            lambda: asyncio.sleep(0, bank.count(f"{who}-ae")), lambda n: n == 1, timeout=30
        )
        # before the tool: started, its task not yet taken when the server dies
        handles["before-tool"] = await start_agent(
            client, tq, plan(step("pay", url, 10, f"{who}-bt"))
        )

        server.kill()
        await asyncio.sleep(down)
        t0 = time.monotonic()
        await asyncio.to_thread(server.restart)
        restarted = time.monotonic() - t0

        # a new call runs on the workers that were there (or on a replacement of a worker
        # that fail-stopped): they reconnected
        t1 = time.monotonic()
        probe_run = await start_agent(client, tq, plan(step("pay", url, 1, f"{who}-new")))
        while True:
            fleet.replace_stopped()
            try:
                await asyncio.wait_for(asyncio.shield(probe_run.result()), 0.5)
                break
            except TimeoutError:
                assert time.monotonic() - t1 < 60, "no worker ran a new call after the restart"
        reconnected = time.monotonic() - t1
        print(
            f"\nserver down {down:g}s: restart {restarted:.2f}s, a new call done {reconnected:.2f}s"
            f" later; workers replaced after a fail-stop: {fleet.replaced}"
        )

        # the approval request, as it was: same step, same hash; approving it pays once
        view = await eventually(
            lambda: approvals.view(client, handles["approval"].id), lambda v: len(v.pending) == 1
        )
        assert [(r.step, r.args_hash) for r in view.pending] == [(asked.step, asked.args_hash)]
        res = await approvals.approve(
            client, handles["approval"].id, asked.step, args_hash=asked.args_hash, by="ops"
        )
        assert res.accepted, res
        # the parked call, still listed with its reason; a person finds the payment
        rows = await reconciliation.list_unresolved(client)
        [again] = [r for r in rows if r.workflow_id == handles["unknown"].id]
        assert (again.step, again.reason) == (row.step, row.reason)
        [paid] = [p for p in bank.payments() if p["to_account"] == f"{who}-un"]
        done = await reconciliation.resolve(
            client, again.workflow_id, again.step, "landed", result=paid, by="ops"
        )
        assert done.accepted, done

        results: dict[str, Any] = {}
        by_person: list[str] = []
        for name, h in handles.items():
            while name not in results:
                fleet.replace_stopped()
                try:
                    [results[name]] = await asyncio.wait_for(asyncio.shield(h.result()), 0.5)
                except TimeoutError:
                    if await settle_parked(client, bank, h.id):
                        by_person.append(name)
        print(f"settled by a person after the restart: {by_person}")
        # only the plain tool's call may need a person (it paid, then lost its claim): a probe,
        # the provider's key or a call not yet in its tool settles the others by themselves
        assert set(by_person) <= {"after-effect"}, by_person
        for name, out in results.items():
            assert "ok" in out, (name, out)
        await asyncio.sleep(1)  # time for a late effect
        accounts = {"pa", "ps", "pi", "ae", "bt", "ap", "un", "new"}
        assert {a: bank.count(f"{who}-{a}") for a in accounts} == dict.fromkeys(accounts, 1)
    finally:
        fleet.stop()


async def settle_parked(client: Client, bank: Bank, workflow_id: str) -> bool:
    """A person's part: a call of ``workflow_id`` parked as unknown is settled by what the
    bank shows (its payment: landed with it; none: not landed, and it runs)."""
    rows = [r for r in await reconciliation.list_unresolved(client) if r.workflow_id == workflow_id]
    for r in rows:
        paid = [p for p in bank.payments() if p["to_account"] == r.args["to"]]
        if paid:
            await reconciliation.resolve(client, workflow_id, r.step, "landed", result=paid[0])
        else:
            await reconciliation.resolve(client, workflow_id, r.step, "not_landed")
    return bool(rows)
