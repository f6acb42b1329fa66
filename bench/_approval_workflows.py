"""The tool and workflow of ``bench/approvals.py``. Sandbox-safe: importing it has no side
effects beyond defining the tool (an idempotent registration in exactcall's registry).

Served in-process by the bench (latency) and by ``python -m exactcall worker --tools
bench._approval_workflows --workflows bench._approval_workflows`` (memory), so it is also
importable as ``bench._approval_workflows`` with the repo root on the path.
"""

from __future__ import annotations

import time
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import exactcall

TOOL = "bench_approved"

# Side channel for the in-process worker: workflow id -> clocks read when the tool body starts.
# Filled by the activity (outside the sandbox), read by the bench in the same process.
STARTED: dict[str, dict[str, float]] = {}


@exactcall.tool(name=TOOL, approval=True)
async def approved(n: int, tag: str) -> dict[str, Any]:
    """Needs a person's approval of its exact arguments; does nothing but note when it ran."""
    mono, wall = time.perf_counter(), time.time()
    info = activity.info()
    STARTED[tag] = {
        "mono": mono,
        "wall": wall,
        "activity_scheduled": info.current_attempt_scheduled_time.timestamp(),
        "activity_started": info.started_time.timestamp(),
    }
    return {"n": n}


@workflow.defn
class ApprovedCall:
    """One call that waits for approval; a denial is the workflow's result, not a failure."""

    @workflow.run
    async def run(self, n: int) -> dict[str, Any]:
        try:
            return await exactcall.call(TOOL, n, workflow.info().workflow_id)
        except exactcall.ApprovalDenied:
            return {"denied": True}
