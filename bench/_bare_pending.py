"""Bare Temporal for ``bench/approvals.py --pending``: a workflow that waits for a person the
way one would write it without exactcall, and a plain worker to serve it.

``BarePending`` publishes what is waiting the same way exactcall does (a memo entry and the
``ExactcallPending`` search attribute, so it is listed and counted by the same visibility
query), waits on a signal carrying ``"approve"`` or ``"deny"``, then runs a plain activity or
returns ``{"denied": True}``. No exactcall import: the worker is a bare ``temporalio`` worker
with the default data converter, and the sandbox re-imports only this module per workflow.

    python -m bench._bare_pending --address HOST:PORT --task-queue Q [--max-cached-workflows N]
        [--workflow-task-pollers N] [--max-concurrent-activities N]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey

SIGNAL = "bench.decide"
MEMO = "bench.pending"
PENDING = SearchAttributeKey.for_bool("ExactcallPending")


@activity.defn(name="bench_bare_approved")
async def bare_approved(n: int, tag: str) -> dict[str, Any]:
    """The approved call: does nothing, like ``bench_approved``."""
    return {"n": n}


@workflow.defn
class BarePending:
    """One call waiting for a decision signal; a denial is the result, not a failure."""

    def __init__(self) -> None:
        self._verdict: str | None = None

    @workflow.signal(name=SIGNAL)
    def decide(self, verdict: str) -> None:
        if self._verdict is None and verdict in ("approve", "deny"):
            self._verdict = verdict

    @workflow.run
    async def run(self, n: int) -> dict[str, Any]:
        wid = workflow.info().workflow_id
        request = {"n": n, "tag": wid, "requested_at": workflow.now().isoformat()}
        workflow.upsert_memo({MEMO: [request]})
        workflow.upsert_search_attributes([PENDING.value_set(True)])
        await workflow.wait_condition(lambda: self._verdict is not None)
        workflow.upsert_memo({MEMO: None})
        workflow.upsert_search_attributes([PENDING.value_set(False)])
        if self._verdict == "approve":
            return await workflow.execute_activity(
                bare_approved, args=[n, wid], start_to_close_timeout=timedelta(seconds=30)
            )
        return {"denied": True}


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="a bare Temporal worker for BarePending")
    ap.add_argument("--address", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--task-queue", required=True)
    ap.add_argument("--max-cached-workflows", type=int)
    ap.add_argument("--workflow-task-pollers", type=int)
    ap.add_argument("--max-concurrent-activities", type=int)
    ap.add_argument("--passthrough-all-modules", action="store_true")
    return ap.parse_args()


async def _serve(ns: argparse.Namespace) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    # the classes of the importable module, not of __main__ (the sandbox re-imports by name)
    from bench._bare_pending import BarePending, bare_approved

    client = await Client.connect(ns.address, namespace=ns.namespace)
    tuning: dict[str, Any] = {  # the same knobs `exactcall worker` passes to the Worker
        "max_cached_workflows": ns.max_cached_workflows,
        "max_concurrent_workflow_task_polls": ns.workflow_task_pollers,
        "max_concurrent_activities": ns.max_concurrent_activities,
    }
    if ns.passthrough_all_modules:  # as `exactcall worker --passthrough-all-modules`
        from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

        restrictions = SandboxRestrictions.default.with_passthrough_all_modules()
        tuning["workflow_runner"] = SandboxedWorkflowRunner(restrictions=restrictions)
    worker = Worker(
        client,
        task_queue=ns.task_queue,
        workflows=[BarePending],
        activities=[bare_approved],
        graceful_shutdown_timeout=timedelta(seconds=10),
        **{k: v for k, v in tuning.items() if v is not None},
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(_serve(_parse()))
