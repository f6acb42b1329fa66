"""Once per attempt chain: real worker processes killed with SIGKILL at each window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from exactcall.demo.bank import Bank
from exactcall.testing import WorkerProcess
from tests.conftest import plan, start_agent, step

pytestmark = pytest.mark.crash


async def crash_then_recover(
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    crash_at: str,
    the_step: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[int]]:
    """Worker A runs the call and is SIGKILLed at ``crash_at``; worker B finishes the job."""
    a = await worker_process(tq, crash_at=crash_at).started()
    handle = await start_agent(client, tq, plan(the_step))
    assert await a.killed() == -9
    await worker_process(tq).started()
    out = await handle.result()
    attempts = []
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attempts.append(ev.activity_task_started_event_attributes.attempt)
    return out, attempts


async def test_killed_between_the_markers_and_the_call_is_unknown_not_re_sent(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    # from outside, an attempt that wrote its pre-call markers may have called the tool
    out, attempts = await crash_then_recover(
        client,
        worker_process,
        tq,
        "pay:in_call:1",
        step("pay", bank.url, 10, who, on_unknown="raise"),
    )
    assert out[0]["error"] == "AmbiguousOutcome"
    assert attempts == [2]
    assert bank.count(to=who) == 0


async def test_killed_after_the_effect_is_unknown_and_not_re_sent(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    out, attempts = await crash_then_recover(
        client,
        worker_process,
        tq,
        "pay:after_call:1",
        step("pay", bank.url, 10, who, on_unknown="raise"),
    )
    assert out[0]["error"] == "AmbiguousOutcome"
    assert "not re-sent" in out[0]["message"]
    assert attempts == [2]
    assert bank.count(to=who) == 1


async def test_killed_after_the_result_was_recorded_returns_it(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    out, attempts = await crash_then_recover(
        client, worker_process, tq, "pay:after_record:1", step("pay", bank.url, 10, who)
    )
    [booked] = [p for p in bank.payments() if p["to_account"] == who]
    assert out[0]["ok"]["payment_id"] == booked["id"]
    # the attempt that claimed the record completed its activity before it was killed: that
    # completion is the result's record, so no attempt runs again
    assert attempts == [1]
    assert bank.count(to=who) == 1


async def test_provider_idempotent_tool_is_re_sent_with_the_same_key(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    out, attempts = await crash_then_recover(
        client, worker_process, tq, "charge:after_call:1", step("charge", bank.url, 30, who)
    )
    receipt = out[0]["ok"]
    assert attempts == [2]
    assert bank.count(to=who) == 1
    [row] = [p for p in bank.payments() if p["id"] == receipt["payment_id"]]
    assert row["request_count"] == 2  # the bank saw the same key twice and booked it once


async def test_killed_before_anything_was_written_calls_it(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    out, attempts = await crash_then_recover(
        client, worker_process, tq, "pay:before_claim:1", step("pay", bank.url, 10, who)
    )
    assert out[0]["ok"]["to"] == who
    assert attempts == [2]
    assert bank.count(to=who) == 1


async def test_crash_points_are_inert_in_a_worker_without_the_crash_plugin(
    client: Client, server: Any, tq: str, bank: Bank, who: str
) -> None:
    from exactcall._crash import CRASH_ENV
    from tests.conftest import ROOT

    # EXACTCALL_CRASH_AT set, but a production worker (no CrashPlugin): nothing kills it
    wp = WorkerProcess(
        server.address,
        tq,
        tools=["tests.tools"],
        workflows=["tests.workflows"],
        env={CRASH_ENV: "pay:after_call:1"},
        arm_crash_points=False,
        cwd=ROOT,
    )
    try:
        await wp.started()
        handle = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)))
        out = await handle.result()
        assert "ok" in out[0], out
        assert wp.proc.poll() is None, "the worker died at a crash point it should not have armed"
        assert bank.count(to=who) == 1
        attempts = [
            ev.activity_task_started_event_attributes.attempt
            async for ev in handle.fetch_history_events()
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        assert attempts == [1]
        assert any("crash.points_not_armed" in line for line in wp.log), wp.tail
    finally:
        wp.stop()


def test_maybe_crash_outside_an_armed_activity_does_not_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exactcall._crash import CRASH_ENV, maybe_crash

    monkeypatch.setenv(CRASH_ENV, "*:after_call")
    maybe_crash("after_call", "pay", 1, "pay#1")  # still alive
