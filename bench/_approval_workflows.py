"""The workflow of ``bench/approvals.py``. Sandbox-safe: its tool lives in
``bench._approval_tools``, imported passed through (not re-imported per workflow).

Served in-process by the bench (latency) and by ``python -m exactcall worker --tools
bench._approval_tools --workflows bench._approval_workflows`` (memory), so it is importable as
``bench._approval_workflows`` with the repo root on the path.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall
    from bench._approval_tools import TOOL


@workflow.defn
class ApprovedCall:
    """One call that waits for approval; a denial is the workflow's result, not a failure."""

    @workflow.run
    async def run(self, n: int) -> dict[str, Any]:
        try:
            return await exactcall.call(TOOL, n, workflow.info().workflow_id)
        except exactcall.ApprovalDenied:
            return {"denied": True}
