"""``exactcall undo WORKFLOW_ID``: undo a finished run's done calls, newest first, each once.

The run's calls are read from its history (as ``exactcall audit`` reads them); those a saga
of the run already undid are left alone. The undos run in a workflow of exactcall's,
``exactcall-undo-<workflow id>``, on the run's task queue, each a guarded call of that
workflow: running the command again is a re-run of that id, and runs no undo twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from ._calls import RunCall, calls_in_history
from ._canonical import to_json_value
from ._confirm import confirm_at_terminal
from ._errors import ExactcallError
from ._undo import UNDO_SUFFIX, Done, UndoInput, UndoReport
from ._wire import UNDO_WORKFLOW, undo_id

__all__ = ["add_parser", "run"]

EXIT_OK, EXIT_NOT_ALL, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any, connection_args: Any) -> None:
    p = sub.add_parser(
        "undo", help="undo the done calls of a finished run, newest first, each once"
    )
    p.add_argument("workflow_id")
    p.add_argument("--run", metavar="RUN_ID", help="a run other than the latest")
    p.add_argument(
        "--step", action="append", default=[], metavar="STEP", help="only this call (repeatable)"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the undos (one may need a person)",
    )
    p.add_argument("--yes", action="store_true", help="do not ask (required without a TTY)")
    p.add_argument("--json", action="store_true")
    connection_args(p)


def _err(msg: str) -> int:
    print(f"exactcall undo: {msg}", file=sys.stderr)
    return EXIT_USAGE


async def run(ns: argparse.Namespace, client: Client) -> int:
    handle = client.get_workflow_handle(ns.workflow_id, run_id=ns.run)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return _err(f"no workflow {ns.workflow_id!r}" + (f" run {ns.run}" if ns.run else ""))
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return _err(
            f"{ns.workflow_id} is still running, and its own saga may undo the same calls: "
            "cancel it (temporal workflow cancel) or wait for it to end, then undo"
        )
    calls = await calls_in_history(
        await handle.fetch_history(), client.data_converter, run_id=desc.run_id
    )
    by_step = {c.step: c for c in calls}
    missing = [s for s in ns.step if s not in by_step]
    if missing:
        return _err(
            f"not a call of {ns.workflow_id}: {', '.join(missing)} "
            f"(its calls: {', '.join(by_step) or 'none'})"
        )
    wanted = [c for c in calls if not c.step.endswith(UNDO_SUFFIX)]
    if ns.step:
        wanted = [c for c in wanted if c.step in ns.step]
    already = [c.step for c in wanted if c.outcome == "undone"]
    nothing = {c.step: c.outcome for c in wanted if c.outcome not in ("done", "undone")}
    todo = sorted((c for c in wanted if c.outcome == "done"), key=lambda c: c.ended_at or c.time)
    if not todo:
        return _print(ns, desc.run_id, UndoReport(), already, nothing, waiting=False)
    if not ns.yes:
        print(f"undo, newest first, in {ns.workflow_id} (run {desc.run_id}):")
        for c in reversed(todo):
            print(f"  {c.step}  {c.tool} {json.dumps(c.args, sort_keys=True)}")
        stop = await asyncio.to_thread(
            confirm_at_terminal,
            "undo these calls?",
            False,
            doing="undo",
            declined="nothing was undone",
        )
        if stop is not None:
            return stop
    inp = UndoInput(
        workflow_id=ns.workflow_id,
        run_id=desc.run_id,
        calls=[_done(c, client) for c in todo],
    )
    h = await client.start_workflow(
        UNDO_WORKFLOW,
        inp,
        id=undo_id(ns.workflow_id),
        task_queue=desc.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        result_type=UndoReport,
        static_summary=f"undo of {ns.workflow_id}",
    )
    try:
        report = await asyncio.wait_for(h.result(), ns.wait)
    except TimeoutError:
        print(
            f"exactcall undo: the undos of {ns.workflow_id} are still running after "
            f"{ns.wait:g} s (one may wait for a person: exactcall approvals list; "
            f"workflow {h.id})",
            file=sys.stderr,
        )
        return EXIT_NOT_ALL
    return _print(ns, desc.run_id, report, already, nothing, waiting=False)


def _done(c: RunCall, client: Client) -> Done:
    result: Any = None
    if c.result is not None:
        try:
            result = to_json_value(
                client.data_converter.payload_converter.from_payload(c.result), "result"
            )
        except (ExactcallError, ValueError, TypeError):
            result = None
    return Done(
        tool=c.tool, step=c.step, key=c.key, args=c.args, result=result, workflow_id=c.workflow_id
    )


def _print(
    ns: argparse.Namespace,
    run_id: str,
    report: UndoReport,
    already: list[str],
    nothing: dict[str, str],
    *,
    waiting: bool,
) -> int:
    if ns.json:
        print(
            json.dumps(
                {
                    "workflow_id": ns.workflow_id,
                    "run_id": run_id,
                    "undo_workflow_id": undo_id(ns.workflow_id),
                    **report.model_dump(),
                    "already_undone": already,
                    "nothing_to_undo": nothing,
                },
                indent=2,
            )
        )
    else:
        for step in report.undone:
            print(f"{step}  undone")
        for step in already:
            print(f"{step}  already undone by {step}{UNDO_SUFFIX} in the run")
        for step in report.skipped:
            print(f"{step}  not undone: its tool declares no undo")
        for step, why in report.failed.items():
            print(f"{step}  undo failed: {why}")
        for step, outcome in nothing.items():
            print(f"{step}  nothing to undo ({outcome})")
        if not (report.undone or already or report.skipped or report.failed or nothing):
            print(f"{ns.workflow_id} made no call to undo")
    ok = not (report.failed or report.skipped or waiting)
    return EXIT_OK if ok else EXIT_NOT_ALL
