"""exactcall.testing, used the way a team would use it on its own agent."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from exactcall.testing import EffectCounter, WorkerProcess, assert_replays
from tests.conftest import plan, step
from tests.workflows import Agent, Rounds, Uncaught

HISTORIES = Path(__file__).parent / "histories"


async def test_crash_at_and_effect_counter(
    exactcall_client: Client,
    exactcall_task_queue: str,
    crash_at: Callable[..., Any],
    effects: EffectCounter,
) -> None:
    tq = exactcall_task_queue
    a: WorkerProcess = await crash_at(
        "counted_send", "after_record", tools=["tests.tools"], workflows=["tests.workflows"]
    )
    handle = await exactcall_client.start_workflow(
        Agent.run,
        plan(step("counted_send", "ops", "hello")),
        id=f"kit-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
    )
    assert await a.killed() == -9
    await crash_at(tools=["tests.tools"], workflows=["tests.workflows"])  # a healthy worker
    out = await handle.result()
    assert out[0]["ok"] == "sent 'hello' to ops"
    assert effects.count("send:ops") == 1  # recorded before the kill, never repeated


async def test_in_process_worker_fixture(
    exactcall_client: Client,
    exactcall_task_queue: str,
    exactcall_worker: Any,
    effects: EffectCounter,
) -> None:
    async with exactcall_worker(workflows=[Agent]):
        out = await (
            await exactcall_client.start_workflow(
                Agent.run,
                plan(step("counted_send", "x", "y"), step("counted_send", "x", "y")),
                id=f"kit-{uuid.uuid4().hex[:8]}",
                task_queue=exactcall_task_queue,
            )
        ).result()
    assert len(out) == 2 and effects.count("send:x") == 2  # two steps: two deliberate sends


async def test_assert_replays_passes_and_fails(tmp_path: Path) -> None:
    await assert_replays(HISTORIES, workflows=[Agent, Rounds, Uncaught])
    from tests.workflows_changed import AgentPaysOneMore

    (tmp_path / "plain_call.json").write_text((HISTORIES / "plain_call.json").read_text())
    with pytest.raises(AssertionError, match="intent drift"):
        await assert_replays(tmp_path, workflows=[AgentPaysOneMore])


async def test_time_skipping_server_expires_a_day_long_approval(
    exactcall_time_skipping: Any, bank: Any, who: str
) -> None:
    from exactcall._worker import build_worker

    env = exactcall_time_skipping
    tq = f"ts-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, tq, [Agent]):
        started = await env.get_current_time()
        out = await env.client.execute_workflow(
            Agent.run,
            plan(step("transfer", bank.url, 10, who)),
            id=f"ts-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        assert out[0]["error"] == "ApprovalExpired"
        assert await env.get_current_time() - started >= timedelta(hours=24)
    assert bank.count(to=who) == 0
