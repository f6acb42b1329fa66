"""Workflows and the tool of ``bench/overhead.py``. Sandbox-safe: importing it has no side
effects beyond defining the tool (an idempotent registration in exactcall's registry)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import exactcall


async def work(n: int) -> dict:
    """The function under test: no I/O, so what is measured is the plumbing around it."""
    return {"n": n}


# The same function, registered two ways. exactcall.tool() is applied first: it copies the
# function's attributes, so it must not see the activity definition activity.defn() attaches.
ec_work = exactcall.tool(name="ec_work")(work)
ec_work_pi = exactcall.tool(name="ec_work_pi", provider_idempotent=True)(work)
"""The same, declared provider-idempotent (``--provider-idempotent``): no pre-call heartbeat."""
bare_work = activity.defn(name="bare_work")(work)
BENCH_BUDGET = exactcall.Budget("bench-calls", limit=10**12)
"""A namespace budget no bench run reaches: each call reserves and spends 1 (bench/budget.py)."""
ec_work_budgeted = exactcall.tool(name="ec_work_budgeted", budgets=[BENCH_BUDGET])(work)


@workflow.defn
class BareCalls:
    """``count`` sequential plain activity calls."""

    @workflow.run
    async def run(self, count: int) -> int:
        for i in range(count):
            await workflow.execute_activity(
                "bare_work", i, start_to_close_timeout=timedelta(seconds=30)
            )
        return count


@workflow.defn
class ExactCalls:
    """``count`` sequential exactcall calls of the same function (tool ``tool``)."""

    @workflow.run
    async def run(self, count: int, tool: str = "ec_work") -> int:
        for i in range(count):
            await exactcall.call(tool, i)
        return count
