"""``exactcall undo WORKFLOW_ID``: undo a run's calls that happened, newest first, each once.

The run's calls are read from its history (as ``exactcall audit`` reads them), an unknown
outcome with its reconciliation's verdict (landed is undone like done); every undo already
made of them, by the run's saga or by an earlier ``exactcall undo``, is read too and never
made again (``_undo_plan``). The undos run in a workflow of exactcall's,
``exactcall-undo-<workflow id>``, on the run's task queue, each as the call ``<step>.undo``
of the run's workflow id: the key its saga would use, so the key's record lets one of them
make it, even while the run still runs.

Exit 0 when everything that happened is undone (reads need nothing), 1 when something that
happened is not (said for each), 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from exactcall._calls import RunCall, calls_in_history, link_undos, with_verdicts
from exactcall._canonical import to_json_value
from exactcall._confirm import confirm_at_terminal
from exactcall._errors import ExactcallError
from exactcall._wire import UNDO_WORKFLOW, undo_id
from exactcall.undo._plan import UndoPlan, plan_undo
from exactcall.undo._undo import Done, RunUndoReport, UndoInput, is_undo_step

__all__ = ["add_parser", "run"]

EXIT_OK, EXIT_NOT_ALL, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any, connection_args: Any) -> None:
    p = sub.add_parser(
        "undo", help="undo the calls of a run that happened, newest first, each once"
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
    conv = client.data_converter
    calls = await calls_in_history(
        await handle.fetch_history(), conv, run_id=desc.run_id, namespace=client.namespace
    )
    by_step = {c.step: c for c in calls}
    missing = [s for s in ns.step if s not in by_step]
    if missing:
        return _err(
            f"not a call of {ns.workflow_id}: {', '.join(missing)} "
            f"(its calls: {', '.join(by_step) or 'none'})"
        )
    undos = [c for c in calls if is_undo_step(c.step)] + await _undos_elsewhere(
        client, ns.workflow_id
    )
    await with_verdicts(client, [*calls, *undos])
    link_undos(calls)
    plan = plan_undo(ns.workflow_id, calls, undos, ns.step)
    if not plan.todo:
        return _print(ns, desc.run_id, RunUndoReport(), plan)
    if not ns.yes:
        print(f"undo, newest first, in {ns.workflow_id} (run {desc.run_id}):")
        for c in reversed(plan.todo):
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
        calls=[_done(c, client) for c in plan.todo],
    )
    h = await client.start_workflow(
        UNDO_WORKFLOW,
        inp,
        id=undo_id(ns.workflow_id),
        task_queue=desc.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        result_type=RunUndoReport,
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
    return _print(ns, desc.run_id, report, plan)


async def _undos_elsewhere(client: Client, workflow_id: str) -> list[RunCall]:
    """The undos ``exactcall undo`` made of ``workflow_id``'s calls: the calls of every run of
    its undo workflow (the latest by describe, which never lags; earlier ones by listing)."""
    uid = undo_id(workflow_id)
    runs: set[str] = set()
    try:
        runs.add((await client.get_workflow_handle(uid).describe()).run_id)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return []
    async for ex in client.list_workflows(f"WorkflowId = '{uid}'"):
        runs.add(ex.run_id)
    out: list[RunCall] = []
    for run_id in sorted(runs):
        history = await client.get_workflow_handle(uid, run_id=run_id).fetch_history()
        calls = await calls_in_history(
            history, client.data_converter, run_id=run_id, namespace=client.namespace
        )
        out += [c for c in calls if is_undo_step(c.step)]
    return out


def _done(c: RunCall, client: Client) -> Done:
    result: Any = c.settled_result  # landed: the result its verdict gave (or None)
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


def _print(ns: argparse.Namespace, run_id: str, report: RunUndoReport, plan: UndoPlan) -> int:
    not_undone = {**plan.blocked, **report.failed, **report.unknown}
    not_undone.update({s: "its tool declares no undo" for s in report.skipped})
    if ns.json:
        print(
            json.dumps(
                {
                    "workflow_id": ns.workflow_id,
                    "run_id": run_id,
                    "undo_workflow_id": undo_id(ns.workflow_id),
                    **report.model_dump(),
                    "already_undone": list(plan.already),
                    "nothing_to_undo": {**plan.nothing, **report.nothing_to_undo},
                    "not_undone": not_undone,
                },
                indent=2,
            )
        )
    else:
        for step in report.undone:
            print(f"{step}  undone")
        for step, where in plan.already.items():
            print(f"{step}  already undone by {where}")
        for step in report.reads:
            print(f"{step}  read-only: nothing to undo")
        for step in report.skipped:
            print(f"{step}  not undone: its tool declares no undo")
        for step, why in report.failed.items():
            print(f"{step}  undo failed: {why}")
        for step, why in report.unknown.items():
            print(f"{step}  undo outcome unknown: {why}")
        for step, why in plan.blocked.items():
            print(f"{step}  not undone: {why}")
        for step, outcome in {**plan.nothing, **report.nothing_to_undo}.items():
            print(f"{step}  nothing to undo ({outcome})")
        if not (report.undone or plan.already or report.reads or not_undone or plan.nothing):
            print(f"{ns.workflow_id} made no call to undo")
    return EXIT_NOT_ALL if not_undone else EXIT_OK
