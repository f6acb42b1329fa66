"""Faults beyond a killed worker (issue 36): a worker frozen (SIGSTOP of its process group) or
cut off from the frontend (a TCP proxy that blackholes its connections) while its attempt is
inside the tool, before the effect; a second worker takes the call over; then the fault heals.
Each case counts payments at the real local HTTP bank: at most one, and the call ends done, or
unknown and listed for a person."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError

import tests.fault_tools  # noqa: F401  (its tools, for the in-process worker)
from exactcall._model import Owner, RecordEvent
from exactcall.activities import Record
from exactcall.activities._calling import LATE_ATTEMPT
from exactcall.activities._cancelling import FAIL_STOP_EXIT
from exactcall.demo.bank import Bank
from exactcall.dev._faults import Mode
from exactcall.embedded._server import DevServer
from exactcall.reconciliation import list_unresolved
from exactcall.reconciliation._verdicts import Settled, reconcile_id
from exactcall.testing import EffectCounter, FaultProxy, WorkerProcess
from tests.conftest import ROOT, plan, start_agent, step
from tests.test_calls import scheduled_intents

pytestmark = pytest.mark.crash

TOOLS = ["tests.fault_tools", "tests.tools"]


@dataclass
class Scene:
    client: Client
    server: DevServer
    bank: Bank
    who: str
    tq: str
    effects: EffectCounter

    def worker(self, address: str, name: str, workflows: bool = True) -> WorkerProcess:
        """A worker process (``workflows=False``: it runs tools only)."""
        wf = ["tests.workflows"] if workflows else []
        return WorkerProcess(address, self.tq, tools=TOOLS, workflows=wf, cwd=ROOT, name=name)

    async def until(self, cond: Callable[[], bool], timeout: float = 30) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not cond():
            assert loop.time() < deadline, "condition not met in time"
            await asyncio.sleep(0.05)

    def paid(self) -> int:
        return self.bank.count(to=self.who)

    def entered(self) -> int:
        return self.effects.count(f"enter:{self.who}")


@pytest.fixture
async def scene(
    client: Client, server: DevServer, bank: Bank, who: str, tq: str, effects: EffectCounter
) -> Scene:
    return Scene(client, server, bank, who, tq, effects)


LINK_FAULTS: dict[str, Mode] = {"partition": "blackhole", "drop": "drop", "delay": "delay"}


@asynccontextmanager
async def faulted(
    s: Scene,
    tool: str,
    fault: str,
    *,
    seconds: float = 4.0,
    hold: float = 6.0,
    after_effect: bool = False,
    delay: float = 3.0,
    successor: bool = True,
    **kw: Any,
) -> AsyncIterator[tuple[Any, WorkerProcess]]:
    """Worker A runs ``tool``; once inside it (``after_effect``: once it paid), A is frozen
    (``fault="freeze"``) or its link to the server fails (``"partition"``: a blackhole;
    ``"drop"``: connections reset and refused; ``"delay"``: every chunk ``delay`` s late)
    for ``hold`` seconds, and worker B starts, to take the call over (unless not
    ``successor``); then the fault heals. Yields the workflow's handle and worker A."""
    with FaultProxy(s.server.address, delay=delay) as proxy:
        a = s.worker(proxy.address, "a")
        b: WorkerProcess | None = None
        try:
            await a.started()
            handle = await start_agent(
                s.client, s.tq, plan(step(tool, s.bank.url, 10, s.who, seconds, **kw))
            )
            await s.until(lambda: (s.paid() if after_effect else s.entered()) == 1)
            if fault == "freeze":
                a.freeze()
            else:
                proxy.mode = LINK_FAULTS[fault]
            if successor:  # (not before: B could have run the call)
                b = s.worker(s.server.address, "b")
            await asyncio.sleep(hold)
            if fault == "freeze":
                a.thaw()
            else:
                proxy.mode = "pass"
            if b is not None:
                await b.started()
            yield handle, a
        finally:
            a.stop()
            if b is not None:
                b.stop()


async def test_frozen_async_tool_with_a_probe_is_cancelled_when_it_wakes(scene: Scene) -> None:
    s = scene
    # woken after the reconciliation's re-run began (a probe said not landed twice)
    async with faulted(s, "fault_book_async", "freeze", hold=9.0) as (handle, a):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out  # re-run by the reconciliation (probe: not landed)
        await asyncio.sleep(2)  # time for a late effect
        assert s.paid() == 1
        assert a.proc.poll() is None  # an async tool is cancelled: no need to stop
        assert any("tool.claim_lost" in line for line in a.log), a.tail


async def test_frozen_sync_tool_that_checks_its_claim_pays_once(scene: Scene) -> None:
    # woken, its thread and the worker's loop run again at once: the thread's check_claim()
    # refuses (the claim's clock moved on while it slept), or the worker stops first
    s = scene
    async with faulted(s, "fault_book_sync_checked", "freeze", hold=9.0) as (handle, a):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        await asyncio.sleep(2)
        assert s.paid() == 1
        assert a.proc.poll() in (None, FAIL_STOP_EXIT), a.tail


async def test_cut_off_sync_tool_stops_its_worker_when_the_claim_runs_out(
    scene: Scene,
) -> None:
    # a sync tool that does not check: nothing can interrupt its thread, so its worker stops
    s = scene
    async with faulted(s, "fault_book_sync", "partition", seconds=6.0, hold=3.0) as (handle, a):
        assert await a.killed(15) == FAIL_STOP_EXIT, a.tail
        assert any("worker.fail_stop" in line for line in a.log), a.tail
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        assert s.paid() == 1


async def test_cut_off_tool_checks_its_claim_before_the_effect(scene: Scene) -> None:
    # its effect runs in a thread that cancelling the tool does not stop: check_claim() does
    s = scene
    # healed at once, but its thread reaches the effect after the re-run began
    async with faulted(s, "fault_book_checked", "partition", seconds=8.0, hold=3.0) as (
        handle,
        a,
    ):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        await asyncio.sleep(2)
        assert s.paid() == 1
        assert any("lost its claim to run" in line for line in a.log), a.tail


async def test_a_probe_not_landed_re_runs_only_once_the_old_attempt_cannot_act(
    scene: Scene,
) -> None:
    # the cut-off attempt, cancelled, finishes a request it had begun 2.5 s later: the first
    # probe sees nothing; the reconciliation asks again once the claim has surely run out
    s = scene
    async with faulted(s, "fault_book_finishing", "partition", hold=3.0) as (handle, _):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert out.get("ok") == {"count": 1}, out  # landed, by the second probe
        await asyncio.sleep(2)
        assert s.paid() == 1
        assert s.entered() == 1  # never re-run


async def test_cut_off_plain_tool_with_a_late_effect_pays_once(scene: Scene) -> None:
    # the late attempt records its result: the call is done by it if the successor looked
    # after it arrived (the cut-off worker's polls, answered once it heals, can delay the
    # successor); else the call was found unknown and parked, and the late result settles it
    s = scene
    async with faulted(
        s, "fault_book_plain", "partition", seconds=2.0, hold=6.0, on_unknown="raise"
    ) as (handle, _):
        [out] = await asyncio.wait_for(handle.result(), 60)
        await s.until(lambda: s.paid() == 1)  # the late effect (the tool finished it)
        if "ok" in out:
            assert out["ok"]["to"] == s.who
        else:
            assert out["error"] == "AmbiguousOutcome", out
            [intent] = await scheduled_intents(s.client, handle)
            rid = reconcile_id(intent.key)
            rec = s.client.get_workflow_handle(rid, result_type=Settled)
            settled = await asyncio.wait_for(rec.result(), 30)
            assert (settled.verdict, settled.decided_by) == ("landed", LATE_ATTEMPT), settled
            assert settled.result["to"] == s.who
        await asyncio.sleep(1)
        assert s.paid() == 1


async def not_landed_is_refused(s: Scene, workflow_id: str, step_name: str) -> bool:
    """``exactcall resolve ... --not-landed`` of the parked call exits 1 (refused)."""
    from exactcall.cli._main import main

    rows: list[Any] = []
    for _ in range(100):  # listed once its reconciliation has parked it
        rows = [r for r in await list_unresolved(s.client) if r.workflow_id == workflow_id]
        if rows:
            break
        await asyncio.sleep(0.1)
    assert [r.step for r in rows] == [step_name]
    argv = ["resolve", workflow_id, step_name, "--not-landed", "--yes"]
    return await asyncio.to_thread(main, [*argv, "--address", s.server.address]) == 1


async def test_not_landed_is_refused_once_a_late_attempt_recorded_a_result(
    scene: Scene,
) -> None:
    s = scene
    # killed after the effect: unknown, parked for a person (no probe)
    a = WorkerProcess(
        s.server.address,
        s.tq,
        tools=TOOLS,
        workflows=["tests.workflows"],
        crash_at="book_no_probe:after_call:1",
        cwd=ROOT,
    )
    b: WorkerProcess | None = None
    try:
        await a.started()
        the_step = step("book_no_probe", s.bank.url, 10, s.who, on_unknown="raise")
        handle = await start_agent(s.client, s.tq, plan(the_step))
        assert await a.killed() == -9
        b = s.worker(s.server.address, "b")
        await b.started()
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert out["error"] == "AmbiguousOutcome", out
        # what a late attempt writes when it made the call after all
        [intent] = await scheduled_intents(s.client, handle)
        [paid] = [p for p in s.bank.payments() if p["to_account"] == s.who]
        late = RecordEvent(
            kind="done", owner=Owner(run_id="late", activity_id="x"), attempt=1, result=paid
        )
        await Record(s.client, intent).mark(late)
        assert await not_landed_is_refused(s, handle.id, intent.step)
        await asyncio.sleep(1)
        assert s.bank.count(to=s.who) == 1
    finally:
        a.stop()
        if b is not None:
            b.stop()


@pytest.mark.parametrize("fault", ["freeze", "partition"])
async def test_provider_idempotent_tool_pays_once(scene: Scene, fault: str) -> None:
    s = scene
    async with faulted(s, "fault_charge", fault, seconds=3.0, hold=5.0) as (handle, a):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        await asyncio.sleep(2)
        assert s.paid() == 1  # the bank replayed any second request
        assert a.proc.poll() is None  # a provider-idempotent tool is not fail-stopped


async def test_a_partition_that_heals_before_the_claim_runs_out_changes_nothing(
    scene: Scene,
) -> None:
    s = scene
    async with faulted(s, "fault_book_async", "partition", seconds=2.0, hold=0.8) as (
        handle,
        a,
    ):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        assert s.paid() == 1 and s.entered() == 1
        assert not any("tool.claim_lost" in line for line in a.log), a.tail


async def test_check_claim_on_a_healthy_worker_says_how_long_the_claim_holds(
    client: Client, worker: Any, tq: str, bank: Bank, who: str
) -> None:
    import exactcall
    from exactcall._errors import ExactcallError

    [out] = await (await start_agent(client, tq, plan(step("claim_left", bank.url, who)))).result()
    assert 1.0 < out["ok"] <= 1.8, out  # heartbeat timeout 2 s, less a tenth
    with pytest.raises(ExactcallError, match="no exactcall tool call is running here"):
        exactcall.check_claim()


async def test_check_claim_in_a_cancelled_call_refuses_and_the_worker_stays_up(
    scene: Scene,
) -> None:
    # the heartbeat's answer says "cancelled", not "lost": NotExecuted, and no fail-stop
    s = scene
    a = s.worker(s.server.address, "a")
    try:
        await a.started()
        handle = await start_agent(
            s.client, s.tq, plan(step("pay_unless_cancelled", s.bank.url, 10, s.who))
        )
        await s.until(lambda: s.entered() == 1)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
        await s.until(lambda: any("tool.not_executed" in line for line in a.log), 10)
        [line] = [line for line in a.log if "tool.not_executed" in line]
        assert "the workflow cancelled the call" in line, line
        assert "lost its claim" not in "".join(a.log), a.tail
        assert a.proc.poll() is None, a.tail
        assert s.paid() == 0
    finally:
        a.stop()
