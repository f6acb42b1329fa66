"""Approvals under load: how fast an approval releases its call, and what pending calls cost.

    python bench/approvals.py                        # embedded dev server with FAST_CONFIG
    python bench/approvals.py --n 20 --pending 200   # smoke run
    python bench/approvals.py --skip-latency --pending 10000 --workflow-task-pollers 20 \
        --max-cached-workflows 12000                 # many pending calls (README)
    python bench/approvals.py --address host:7233    # an existing server

a. Latency: ``--n`` workflows, each with one ``@exactcall.tool(approval=True)`` call, served by
   an in-process worker. Once the call is pending (seen by query), the bench sends the approve
   signal and the tool body notes when it starts (a dict in the same process). The raw signal
   (``client.get_workflow_handle(id).signal(DECIDE_SIGNAL, Decision(...))``) and the full
   ``exactcall.approvals.approve(...)`` round trip (signal, then the confirming query) are
   measured on alternate workflows (ABBA order).
b. Scale: ``--pending`` workflows waiting for approval at once on ONE worker, run as a
   subprocess so its memory can be read from /proc, first with a bare Temporal workflow that
   waits on a signal (``bench/_bare_pending.py``), then with exactcall (``python -m exactcall
   worker``): time until all are listed, the worker's RSS, the cost of listing them (and of
   ``exactcall approvals list --json``), the latency of one decision on a call started first
   and on one started last (with a cache smaller than N, the first were evicted: a replay),
   then every other call approved or denied and every workflow closed, results checked.
   See bench/_pending.py.

Figures are printed and written as JSON; nothing is asserted on time. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(HERE), str(ROOT)):  # bench helpers; bench._approval_workflows (as the worker)
    if p not in sys.path:
        sys.path.insert(0, p)

from _guard import watch  # noqa: E402
from _pending import many_pending, poll, print_table  # noqa: E402
from overhead import fmt_load, log, pct, setup_logging, temporal_version  # noqa: E402

MODES = ("signal", "approve()")
BY = "bench"
# Dynamic config for many pending calls, added to the embedded server's (see README): the dev
# server re-reads search-attribute metadata from persistence on every read, which costs ~0.1 ms
# of server CPU per listed workflow and, under load, "System Persistence Max QPS Reached"
# errors that the client retries after ~1 s. Its search attributes are registered at start.
MANY_PENDING_CONFIG = ("system.forceSearchAttributesCacheRefreshOnRead=false",)


# -- helpers -------------------------------------------------------------------------------
def stats_ms(values: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50": statistics.median(ms),
        "p95": pct(ms, 95),
        "mean": statistics.fmean(ms),
        "min": min(ms),
        "max": max(ms),
    }


# -- a. approve -> tool start --------------------------------------------------------------
async def approve_latency(client: Any, tq: str, args: argparse.Namespace) -> dict[str, Any]:
    from bench._approval_tools import STARTED
    from bench._approval_workflows import ApprovedCall
    from exactcall import approvals

    run = uuid.uuid4().hex[:8]

    async def one(i: int, mode: str) -> dict[str, Any]:
        wid = f"bench-approve-{run}-{mode[:7]}-{i}"
        t_start = time.perf_counter()
        handle = await client.start_workflow(ApprovedCall.run, i, id=wid, task_queue=tq)
        view, _ = await poll(
            lambda: approvals.view(client, wid), lambda v: bool(v.pending), 60, 0.01
        )
        t_pending = time.perf_counter()
        req = view.pending[0]
        wall0, t0 = time.time(), time.perf_counter()
        if mode == "signal":
            decision = approvals.Decision(
                decision="approve", args_hash=req.args_hash, step=req.step, by=BY
            )
            await client.get_workflow_handle(wid).signal(approvals.DECIDE_SIGNAL, decision)
            accepted = None  # not confirmed: that is the point of the raw signal
        else:
            res = await approvals.approve(client, wid, req.step, args_hash=req.args_hash, by=BY)
            accepted = res.accepted
        t_returned = time.perf_counter()
        result = await asyncio.wait_for(handle.result(), 60)
        s = STARTED.pop(wid)
        return {
            "workflow_id": wid,
            "pending_visible_s": t_pending - t_start,
            "returned_s": t_returned - t0,  # the signal RPC, or approve()'s whole round trip
            "tool_start_s": s["mono"] - t0,
            "to_activity_scheduled_s": s["activity_scheduled"] - wall0,
            "scheduled_to_started_s": s["activity_started"] - s["activity_scheduled"],
            "started_to_tool_s": s["wall"] - s["activity_started"],
            "accepted": accepted,
            "ran": result == {"n": i},
        }

    log(f"a. warm-up: {args.warmup} approvals per mode")
    for i in range(args.warmup):
        for mode in MODES:
            await one(-1 - i, mode)
    log(f"a. approve -> tool start: {args.n} workflows per mode, alternating (ABBA)")
    raw: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for i in range(args.n):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            raw[mode].append(await one(i, mode))
    return raw


def latency_rows(raw: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str, dict]]:
    sig, app = raw["signal"], raw["approve()"]

    def col(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
        return stats_ms([r[key] for r in rows])

    return [
        ("signal sent -> tool body starts", "signal_to_tool", col(sig, "tool_start_s")),
        ("  signal RPC returns", "signal_rpc", col(sig, "returned_s")),
        (
            "  signal sent -> activity scheduled (server clock)",
            "signal_to_scheduled",
            col(sig, "to_activity_scheduled_s"),
        ),
        (
            "  activity scheduled -> started",
            "scheduled_to_started",
            col(sig, "scheduled_to_started_s"),
        ),
        (
            "  activity started -> tool body (claim || heartbeat)",
            "started_to_tool",
            col(sig, "started_to_tool_s"),
        ),
        (
            "approvals.approve() round trip (signal + query)",
            "approve_round_trip",
            col(app, "returned_s"),
        ),
        (
            "approvals.approve() called -> tool body starts",
            "approve_to_tool",
            col(app, "tool_start_s"),
        ),
        (
            "start_workflow -> pending seen by query (10 ms polls)",
            "start_to_pending",
            col(sig + app, "pending_visible_s"),
        ),
    ]


def print_latency(rows: list[tuple[str, str, dict]], n: int) -> None:
    width = max(len(r[0]) for r in rows)
    title = f"approve -> tool start, {n} per mode (ms)"
    head = f"{title:<{width}}  {'p50':>7}  {'p95':>7}  {'mean':>7}"
    log(head)
    log("-" * len(head))
    for label, _, s in rows:
        log(f"{label:<{width}}  {s['p50']:7.1f}  {s['p95']:7.1f}  {s['mean']:7.1f}")


# -- main ----------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="approvals measured per mode (a)")
    ap.add_argument("--pending", type=int, default=1000, help="calls pending at once (b)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up approvals per mode / in (b)")
    ap.add_argument("--concurrency", type=int, default=50, help="starts/decisions in flight (b)")
    ap.add_argument("--sample", type=int, default=20, help="single decisions timed per end (b)")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between count polls (b)")
    w = ap.add_argument_group("worker settings (b), passed to both workers; unset: SDK default")
    w.add_argument("--max-cached-workflows", type=int)
    w.add_argument("--workflow-task-pollers", type=int)
    w.add_argument("--max-concurrent-activities", type=int)
    w.add_argument(
        "--passthrough-all-modules",
        action="store_true",
        help="no per-run imports in the sandbox",
    )
    ap.add_argument("--address", help="use an existing server instead of the embedded one")
    ap.add_argument("--namespace", default="default")
    ap.add_argument(
        "--default-server", action="store_true", help="embedded server without FAST_CONFIG"
    )
    ap.add_argument(
        "--stock-sa-cache",
        action="store_true",
        help="keep the dev server's search-attribute refresh on every read (MANY_PENDING_CONFIG)",
    )
    ap.add_argument(
        "--dynamic-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more dynamic config for the embedded server (repeatable)",
    )
    ap.add_argument("--skip-latency", action="store_true", help="only part b")
    ap.add_argument("--skip-pending", action="store_true", help="only part a")
    ap.add_argument("--skip-bare", action="store_true", help="part b without the bare phase")
    ap.add_argument(
        "--bare-last",
        action="store_true",
        help="part b: the exactcall phase first, then bare (the second phase runs on a server "
        "that holds the first one's closed workflows, which makes it slower)",
    )
    ap.add_argument("--json", type=Path, help="where to write the raw numbers")
    ap.add_argument(
        "--log-level", default="INFO", help="exactcall's log level (JSON lines to a .log file)"
    )
    return ap.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    import temporalio

    from exactcall._worker import Connection, build_worker, connect
    from exactcall.embedded._server import FAST_CONFIG, DevServer

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = args.json or HERE / "results" / f"approvals-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    log_path = json_path.with_suffix(".log")
    log_dir = json_path.with_suffix("")  # the workers' output: <stem>/<flavour>.worker.log
    log_dir.mkdir(exist_ok=True)
    setup_logging(args.log_level, log_path)
    config: dict[str, Any] = {
        "started": stamp,
        "python": platform.python_version(),
        "temporalio": temporalio.__version__,
        "cpus": os.cpu_count(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    result: dict[str, Any] = {"config": config}

    def save() -> None:
        json_path.write_text(json.dumps(result, indent=1))

    server: DevServer | None = None
    if args.address:
        address = args.address
        config["server"] = {"kind": "existing", "address": address}
        log(f"server: existing server at {address} (its dynamic config is not known here)")
    else:
        extra = [*([] if args.stock_sa_cache else MANY_PENDING_CONFIG), *args.dynamic_config]
        dynamic = [a for v in extra for a in ("--dynamic-config-value", v)]
        server = DevServer(fast=not args.default_server, extra_args=dynamic)
        server.start()
        address = server.address
        config["server"] = {
            "kind": "embedded",
            "version": temporal_version(),
            "address": address,
            "fast": server.fast,
            "dynamic_config": [*(FAST_CONFIG if server.fast else ()), *extra],
            "command": server.command(),
        }
        log(f"server: embedded `temporal server start-dev` ({config['server']['version']})")
        log(f"        at {address}, in-memory SQLite, fast={server.fast}")
    server_pid = server._proc.pid if server is not None and server._proc is not None else None
    watch(server_pid)
    log(
        f"host: {config['cpus']} CPUs, Python {config['python']}, temporalio "
        f"{config['temporalio']}; logs: {log_path}, worker subprocesses: {log_dir}/"
    )
    config["loadavg_start"] = os.getloadavg()
    log(f"load average before: {fmt_load(config['loadavg_start'])} (other processes add noise)\n")
    try:
        from bench._approval_workflows import ApprovedCall

        client = await connect(Connection(address=address, namespace=args.namespace))
        tq = f"bench-approve-{uuid.uuid4().hex[:12]}"
        # the in-process worker (part a) stays up, idle, until everything is saved: a crash
        # at worker shutdown (sdk-python #300) must not lose part b
        async with build_worker(client, tq, [ApprovedCall]):
            if not args.skip_latency:
                raw = await approve_latency(client, tq, args)
                rows = latency_rows(raw)
                result["latency"] = {"summary_ms": {k: s for _, k, s in rows}, "raw": raw}
                config["loadavg_after_latency"] = os.getloadavg()
                log("")
                print_latency(rows, args.n)
                log(f"load average: {fmt_load(config['loadavg_after_latency'])}\n")
                save()
            if not args.skip_pending:
                result["pending"] = await many_pending(client, address, args, log_dir, server_pid)
                log("")
                print_table(result["pending"], args.pending)
            config["loadavg_end"] = os.getloadavg()
            save()
            log(f"load average after: {fmt_load(config['loadavg_end'])}")
            log(f"\nraw numbers: {json_path}\nlogs: {log_path}, {log_dir}/")
    finally:
        if "loadavg_end" not in config:  # failed or interrupted: keep what was measured
            config["loadavg_end"] = os.getloadavg()
            save()
            if server is not None and server._proc is not None:
                code = server._proc.poll()
                state = "running" if code is None else f"exited with {code}"
                log(f"dev server {state}; its log ends with:\n{server.log_tail()}")
        if server is not None:
            server.stop()
    return 0


async def amain_cancellable(args: argparse.Namespace) -> int:
    """amain, cancelled by SIGTERM or SIGINT so that it stops the server and the worker."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(amain(args))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        log("interrupted")
        return 130


def main(argv: Sequence[str] | None = None) -> None:
    code = 1
    try:
        code = asyncio.run(amain_cancellable(parse(argv)))
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # temporalio sdk-python #300: a process that ran a worker can crash at interpreter exit
        os._exit(code)


if __name__ == "__main__":
    main()
