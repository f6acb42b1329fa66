"""The tool of ``bench/approvals.py``: served with ``--tools bench._approval_tools``.

Kept apart from the workflow (``bench/_approval_workflows.py``), as the README lays an app
out (``--tools myapp.tools --workflows myapp.workflows``): the sandbox re-imports a workflow's
module for every workflow it runs, so a tool defined there would be re-created per call.
"""

from __future__ import annotations

import time
from typing import Any

from temporalio import activity

import exactcall

TOOL = "bench_approved"

# Side channel for the in-process worker: workflow id -> clocks read when the tool body starts.
# Filled by the activity, read by the bench in the same process (part a).
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
