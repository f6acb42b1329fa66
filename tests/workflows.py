"""Workflows used by the tests: plain Temporal workflows that call tools through exactcall."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import exactcall


async def _one(step: dict[str, Any]) -> dict[str, Any]:
    try:
        if step.get("call_with"):
            result = await exactcall.call_with(
                step["tool"],
                args=step.get("args", []),
                kwargs=step.get("kwargs", {}),
                key=step.get("key"),
            )
        else:
            result = await exactcall.call(
                step["tool"],
                *step.get("args", []),
                key=step.get("key"),
                on_unknown=step.get("on_unknown"),
                **step.get("kwargs", {}),
            )
        return {"ok": result}
    except exactcall.ExactcallError as err:
        return {"error": err.code, "message": err.message, "fields": err.fields}


@workflow.defn
class Agent:
    """Runs a plan of calls: in order, or all at once with ``concurrent``."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        steps = plan["steps"]
        if plan.get("wait_first"):
            await workflow.wait_condition(lambda: self._go)
            self._go = False
        if plan.get("concurrent"):
            out = list(await asyncio.gather(*(_one(s) for s in steps)))
        else:
            out = [await _one(s) for s in steps]
        if plan.get("wait_signal"):
            await workflow.wait_condition(lambda: self._go)
        if plan.get("fail_after"):
            raise ApplicationError("the agent failed after its calls", non_retryable=True)
        if plan.get("fail_first_attempt") and workflow.info().attempt == 1:
            raise ApplicationError("the agent's first attempt failed after its calls")
        return out

    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True


@workflow.defn
class Uncaught:
    """Lets exactcall's errors escape: the workflow must fail, not retry its task forever."""

    @workflow.run
    async def run(self, step: dict[str, Any]) -> Any:
        return await exactcall.call(step["tool"], *step.get("args", []), **step.get("kwargs", {}))


@workflow.defn
class Rounds:
    """Calls a tool once per round, continuing as new between rounds."""

    @workflow.run
    async def run(self, bank: str, to: str, rounds: int, seen: list[str]) -> list[str]:
        receipt = await exactcall.call("whoami", bank, to)
        seen = [*seen, receipt["step"]]
        if rounds > 1:
            workflow.continue_as_new(args=[bank, to, rounds - 1, seen])
        return seen


@workflow.defn
class BareAgent:
    """The same payment as a plain Temporal activity, without exactcall (for comparison)."""

    @workflow.run
    async def run(self, bank: str, amount: int, to: str) -> Any:
        return await workflow.execute_activity(
            "bare_pay",
            args=[bank, amount, to],
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=2),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )


@workflow.defn
class Forge:
    """Schedules a tool activity with a hand-made intent (an edited history, or a bug)."""

    @workflow.run
    async def run(self, intent: exactcall.Intent) -> Any:
        return await workflow.execute_activity(
            intent.tool,
            intent,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@workflow.defn
class LyingAgent:
    """Uses a tool that lies about its effect (for crashtest's negative case)."""

    @workflow.run
    async def run(self, bank: str) -> Any:
        return await exactcall.call("lying_pay", bank, 1, "lied-to")


@workflow.defn
class SagaAgent:
    """Runs a plan's steps inside ``exactcall.saga()``; ``fail`` raises after them (the saga
    undoes), ``undo`` undoes explicitly that many times; returns the steps' outcomes and the
    reports."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        reports: list[dict[str, Any]] = []
        async with exactcall.saga() as s:
            out = [await _one(step) for step in plan["steps"]]
            for _ in range(plan.get("undo", 0)):
                reports.append((await s.undo()).model_dump())
            if plan.get("fail"):
                raise ApplicationError("the agent failed after its calls", non_retryable=True)
        return {"out": out, "reports": reports}
