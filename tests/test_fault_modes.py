"""The fault proxy's other link faults (issue 36 §2): a worker's connections to the server
reset and refused (``drop``) or slowed (``delay``), before the tool, inside it before the
effect and after the effect; a slow or briefly cut link that heals before the attempt's claim
runs out. The scenes of tests/test_faults.py; payments counted at the real local HTTP bank:
one per call, and every call ends (a person settles only a plain tool's call, by what the bank
shows)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exactcall.activities._cancelling import FAIL_STOP_EXIT
from exactcall.testing import FaultProxy
from tests.conftest import plan, start_agent, step
from tests.test_faults import (
    Scene,
    faulted,
    scene,  # noqa: F401  (the fixture)
)
from tests.test_server_faults import settle_parked

pytestmark = pytest.mark.crash


async def ends(s: Scene, handle: Any, timeout: float = 60) -> tuple[Any, bool]:
    """The call's outcome, and whether a person had to settle it (parked as unknown)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    by_person = False
    while True:
        try:
            [out] = await asyncio.wait_for(asyncio.shield(handle.result()), 0.5)
            return out, by_person
        except TimeoutError:
            assert loop.time() < deadline, "the call did not end"
            by_person = await settle_parked(s.client, s.bank, handle.id) or by_person


@pytest.mark.parametrize(
    ("tool", "fault", "after_effect"),
    [
        ("fault_book_async", "drop", False),  # probe, async: cancelled, re-run once
        ("fault_charge", "delay", False),  # provider-idempotent, sync: the bank replays
        ("fault_pay_then_wait", "delay", True),  # probe, sync: found landed
        ("slow_pay", "drop", True),  # plain, async: unknown, a person settles it
    ],
)
async def test_a_link_fault_in_the_tool_gives_one_effect(
    scene: Scene,  # noqa: F811  (the fixture imported above)
    tool: str,
    fault: str,
    after_effect: bool,
) -> None:
    s = scene
    cut = faulted(s, tool, fault, seconds=3.0, hold=4.0, after_effect=after_effect)
    async with cut as (handle, a):
        out, by_person = await ends(s, handle)
        await asyncio.sleep(1)  # time for a late effect
        assert s.paid() == 1
        assert "ok" in out, out
        assert by_person == (tool == "slow_pay"), out
        if tool == "fault_pay_then_wait":
            assert out["ok"] == {"count": 1}  # by the probe: not re-run
        # a sync tool that does not check its claim stops its worker (fail-stop), unless its
        # late effect is harmless (provider-idempotent)
        expected = (None, FAIL_STOP_EXIT) if tool == "fault_pay_then_wait" else (None,)
        assert a.proc.poll() in expected, a.tail
        assert any("tool.claim_lost" in line for line in a.log), a.tail  # the fault bit


@pytest.mark.parametrize(
    ("tool", "fault", "hold", "delay"),
    [
        ("fault_book_sync", "drop", 0.5, 0.0),  # probe, sync: cut off half a second
        ("fault_book_plain", "delay", 4.0, 0.1),  # plain, async: a slow link, all along
    ],
)
async def test_a_link_fault_that_heals_before_the_claim_runs_out_changes_nothing(
    scene: Scene,  # noqa: F811
    tool: str,
    fault: str,
    hold: float,
    delay: float,
) -> None:
    s = scene
    # no successor: the call must go on on A
    cut = faulted(s, tool, fault, seconds=3.0, hold=hold, delay=delay, successor=False)
    async with cut as (handle, a):
        [out] = await asyncio.wait_for(handle.result(), 60)
        assert "ok" in out, out
        assert s.paid() == 1 and s.entered() == 1  # never re-run
        assert not any("claim_lost" in line for line in a.log), a.tail
        assert a.proc.poll() is None, a.tail


async def test_a_worker_cut_off_before_the_tool_never_runs_the_call(
    scene: Scene,  # noqa: F811
) -> None:
    # A (tools only) is cut off before the call is scheduled: an activity task handed to its
    # poll in flight is never answered, times out, and runs on B; healed, A may get that task
    # late, and its attempt is refused before the tool
    s = scene
    with FaultProxy(s.server.address) as proxy:
        a = s.worker(proxy.address, "a", workflows=False)
        b = s.worker(s.server.address, "b")
        try:
            await a.started()
            proxy.mode = "blackhole"
            await b.started()
            the_step = step("fault_book_sync", s.bank.url, 10, s.who, 0.5)
            handle = await start_agent(s.client, s.tq, plan(the_step))
            [out] = await asyncio.wait_for(handle.result(), 60)
            proxy.mode = "pass"
            await asyncio.sleep(3)  # A, healed, gets what it was sent
            assert "ok" in out, out
            assert s.paid() == 1 and s.entered() == 1
            assert a.proc.poll() is None, a.tail
        finally:
            a.stop()
            b.stop()
