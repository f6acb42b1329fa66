"""Approvals under load: how fast an approval releases its call, and what pending calls cost.

    python bench/approvals.py                        # embedded dev server with FAST_CONFIG
    python bench/approvals.py --n 20 --pending 200   # smoke run
    python bench/approvals.py --address host:7233    # an existing server

a. Latency: ``--n`` workflows, each with one ``@exactcall.tool(approval=True)`` call, served by
   an in-process worker. Once the call is pending (seen by query), the bench sends the approve
   signal and the tool body notes when it starts (a dict in the same process). The raw signal
   (``client.get_workflow_handle(id).signal(DECIDE_SIGNAL, Decision(...))``) and the full
   ``exactcall.approvals.approve(...)`` round trip (signal, then the confirming query) are
   measured on alternate workflows (ABBA order).
b. Scale: ``--pending`` workflows waiting for approval at once on ONE worker, run as a
   subprocess (``python -m exactcall worker``) so its memory can be read from /proc: time until
   ``approvals.list_pending`` sees them all, the worker's RSS before and after, the cost of
   listing them (in-process and with the ``exactcall approvals list --json`` CLI); then all
   are denied by signal and the bench waits until every workflow has closed.

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
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(HERE), str(ROOT)):  # bench helpers; bench._approval_workflows (as the worker)
    if p not in sys.path:
        sys.path.insert(0, p)

from _guard import watch  # noqa: E402
from overhead import (  # noqa: E402
    fmt_load,
    log,
    pct,
    server_cpu_s,
    setup_logging,
    temporal_version,
)

T = TypeVar("T")
WORKFLOWS_MODULE = "bench._approval_workflows"
MODES = ("signal", "approve()")
BY = "bench"


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


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, in KiB, plus its CPU time in ms."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_ms"] = (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    return out


async def poll(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float, every: float
) -> tuple[T, int]:
    """Call ``fn`` until ``ok(value)``; the value and how many calls it took. Errors (a query
    before the worker has the workflow) count as not yet; a stuck run fails after timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    calls = 0
    while True:
        calls += 1
        try:
            value = await fn()
            if ok(value):
                return value, calls
        except Exception:
            if loop.time() > deadline:
                raise
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met in {timeout:g}s")
        await asyncio.sleep(every)


async def bounded(n: int, limit: int, fn: Callable[[int], Awaitable[T]]) -> list[T]:
    """``fn(0..n-1)`` with at most ``limit`` in flight."""
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> T:
        async with sem:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


# -- a. approve -> tool start --------------------------------------------------------------
async def approve_latency(client: Any, tq: str, args: argparse.Namespace) -> dict[str, Any]:
    from bench._approval_workflows import STARTED, ApprovedCall
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


# -- b. many pending calls on one worker ---------------------------------------------------
def worker_command(address: str, namespace: str, tq: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exactcall",
        "--log-level",
        "WARNING",
        "worker",
        "--address",
        address,
        "--namespace",
        namespace,
        "--task-queue",
        tq,
        "--tools",
        WORKFLOWS_MODULE,
        "--workflows",
        WORKFLOWS_MODULE,
    ]


def spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """The worker, in its own session (SIGINT at the terminal reaches the bench only)."""
    with log_path.open("w") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def run_cli(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "exactcall", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return time.perf_counter() - t0, out


async def many_pending(
    client: Any, address: str, args: argparse.Namespace, worker_log: Path, server_pid: int | None
) -> dict[str, Any]:
    from bench._approval_workflows import ApprovedCall
    from exactcall import approvals

    run = uuid.uuid4().hex[:8]
    tq = f"bench-pending-{run}"
    prefix = f"bench-pending-{run}-"
    count = args.pending
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = worker_command(address, args.namespace, tq)
    out: dict[str, Any] = {"worker_command": cmd, "pending": count}
    log(f"b. worker subprocess: {' '.join(cmd[1:])}")
    proc = spawn(cmd, env, worker_log)
    watch(proc.pid, b"exactcall")
    try:

        async def start(i: int, wid_prefix: str = prefix) -> Any:
            return await client.start_workflow(
                ApprovedCall.run, i, id=f"{wid_prefix}{i}", task_queue=tq
            )

        async def deny(req: Any) -> None:
            d = approvals.Decision(
                decision="deny", args_hash=req.args_hash, step=req.step, by=BY, reason="bench"
            )
            await client.get_workflow_handle(req.workflow_id).signal(approvals.DECIDE_SIGNAL, d)

        # warm-up (the worker imports, registers, fills its caches): a few calls, then denied
        warm_prefix = f"{prefix}warm-"
        warm = [await start(i, warm_prefix) for i in range(args.warmup)]
        t0 = time.perf_counter()
        for h in warm:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({proc.returncode}): see {worker_log}")
            view, _ = await poll(
                lambda h=h: approvals.view(client, h.id), lambda v: bool(v.pending), 60, 0.05
            )
            await deny(view.pending[0])
        await asyncio.gather(*(asyncio.wait_for(h.result(), 60) for h in warm))
        out["worker_ready_s"] = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        before = proc_status(proc.pid)
        out["worker_before"] = before
        log(
            f"b. worker up (pid {proc.pid}): VmRSS {before['VmRSS'] / 1024:.1f} MiB, "
            f"VmHWM {before['VmHWM'] / 1024:.1f} MiB; starting {count} workflows"
        )

        t0, server0 = time.perf_counter(), server_cpu_s(server_pid)
        handles = await bounded(count, args.concurrency, start)
        t_started, wall_started = time.perf_counter(), time.time()
        out["start_all_s"] = t_started - t0

        def mine(workflow_id: str) -> bool:
            return workflow_id.startswith(prefix) and not workflow_id.startswith(warm_prefix)

        def ours(reqs: list[Any]) -> list[Any]:
            return [r for r in reqs if mine(r.workflow_id)]

        # a cheap count every 0.1 s (listing 1000 calls every 0.1 s would load the very server
        # and CPUs being measured), then list_pending until it returns them all
        query = (
            f"{approvals.PENDING_ATTRIBUTE} = true AND ExecutionStatus = 'Running' "
            f"AND TaskQueue = '{tq}'"
        )
        _, counts = await poll(
            lambda: client.count_workflows(query), lambda c: c.count >= count, 300, 0.1
        )
        listed, polls = await poll(
            lambda: approvals.list_pending(client), lambda r: len(ours(r)) >= count, 300, 0.1
        )
        t_listed, wall_listed = time.perf_counter(), time.time()
        out["count_polls"] = counts
        out["listed_after_last_start_s"] = t_listed - t_started
        out["listed_after_first_start_s"] = t_listed - t0
        out["list_polls"] = polls
        # where the wait went: the worker's first workflow task of each call (requested_at is
        # that task's workflow.now(), server clock, same host), then visibility
        last_request = max(r.requested_at for r in ours(listed)).timestamp()
        out["last_start_to_last_request_s"] = last_request - wall_started
        out["last_request_to_listed_s"] = wall_listed - last_request
        after = proc_status(proc.pid)
        server1 = server_cpu_s(server_pid)
        busy = t_listed - t0  # CPU used from the first start until all are listed, in cores
        out["worker_cores_busy"] = (after["cpu_ms"] - before["cpu_ms"]) / 1000 / busy
        if server0 is not None and server1 is not None:
            out["server_cores_busy"] = (server1 - server0) / busy
        await asyncio.sleep(2.0)
        settled = proc_status(proc.pid)
        out["worker_after"] = after
        out["worker_after_2s"] = settled
        log(f"b. all {count} listed {out['listed_after_last_start_s']:.2f}s after the last start")

        log("b. listing: approvals.list_pending in-process and the CLI, 3 rounds")
        list_argv = ["approvals", "list", "--json", "--address", address]
        list_argv += ["--namespace", args.namespace]
        in_process: list[float] = []
        cli: list[float] = []
        startup: list[float] = []
        for _ in range(3):  # interleaved, so drift and background load hit all three alike
            t = time.perf_counter()
            reqs = await approvals.list_pending(client)
            in_process.append(time.perf_counter() - t)
            out["list_pending_count"] = len(ours(reqs))
            dt, res = await asyncio.to_thread(run_cli, list_argv)
            if res.returncode != 0:
                raise RuntimeError(f"exactcall approvals list failed: {res.stderr[-2000:]}")
            cli.append(dt)
            rows = json.loads(res.stdout)
            out["cli_count"] = sum(mine(r["workflow_id"]) for r in rows)
            out["cli_json_bytes"] = len(res.stdout)
            # the same command without the RPCs: interpreter start-up, imports, argparse
            dt, _ = await asyncio.to_thread(run_cli, ["approvals", "list", "--help"])
            startup.append(dt)
        out["list_pending_s"] = in_process
        out["cli_list_s"] = cli
        out["cli_startup_s"] = startup

        log(f"b. denying all {count} by signal, then waiting for every workflow to close")
        t0 = time.perf_counter()
        to_deny = ours(listed)
        await bounded(len(to_deny), args.concurrency, lambda i: deny(to_deny[i]))
        out["deny_all_s"] = time.perf_counter() - t0
        results = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in handles)), max(120, count / 5)
        )
        out["closed_all_s"] = time.perf_counter() - t0
        out["denied_results"] = sum(r == {"denied": True} for r in results)
        await asyncio.sleep(2.0)
        out["worker_closed"] = proc_status(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # graceful: run_worker stops on SIGTERM
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        out["worker_exit_code"] = proc.returncode
    return out


def pending_rows(b: dict[str, Any]) -> list[tuple[str, str, str]]:
    n = b["pending"]
    before, after = b["worker_before"], b["worker_after"]
    mib = 1024.0
    med = statistics.median
    return [
        (
            f"start {n} workflows ({b.get('concurrency', '')} at a time)",
            f"{b['start_all_s']:.2f}",
            "s",
        ),
        (
            f"last start -> list_pending returns all {n}",
            f"{b['listed_after_last_start_s']:.2f}",
            "s",
        ),
        (
            f"first start -> list_pending returns all {n}",
            f"{b['listed_after_first_start_s']:.2f}",
            "s",
        ),
        (
            "  last start -> last call requested (its first wf task)",
            f"{b['last_start_to_last_request_s']:.2f}",
            "s",
        ),
        (
            "  last call requested -> listed (visibility + poll)",
            f"{b['last_request_to_listed_s']:.2f}",
            "s",
        ),
        ("  list_pending calls until then", f"{b['list_polls']}", ""),
        ("worker VmHWM (peak RSS) before", f"{before['VmHWM'] / mib:.1f}", "MiB"),
        (f"worker VmHWM with {n} pending", f"{after['VmHWM'] / mib:.1f}", "MiB"),
        ("worker VmRSS before", f"{before['VmRSS'] / mib:.1f}", "MiB"),
        (f"worker VmRSS with {n} pending", f"{after['VmRSS'] / mib:.1f}", "MiB"),
        (
            "  per pending call, VmHWM delta / n",
            f"{(after['VmHWM'] - before['VmHWM']) / n:.1f}",
            "KiB",
        ),
        (
            "  per pending call, VmRSS delta / n",
            f"{(after['VmRSS'] - before['VmRSS']) / n:.1f}",
            "KiB",
        ),
        (
            "  worker CPU per call to reach pending",
            f"{(after['cpu_ms'] - before['cpu_ms']) / n:.2f}",
            "ms",
        ),
        ("  worker CPU, first start -> all listed", f"{b['worker_cores_busy']:.2f}", "cores"),
        (
            "  dev server CPU, first start -> all listed",
            f"{b['server_cores_busy']:.2f}" if "server_cores_busy" in b else "-",
            "cores",
        ),
        (
            f"approvals.list_pending, {b['list_pending_count']} (median of 3)",
            f"{med(b['list_pending_s']):.3f}",
            "s",
        ),
        (
            f"exactcall approvals list --json, {b['cli_count']} (median of 3)",
            f"{med(b['cli_list_s']):.3f}",
            "s",
        ),
        ("  CLI start-up alone (approvals list --help)", f"{med(b['cli_startup_s']):.3f}", "s"),
        (
            f"deny {n} by signal ({b.get('concurrency', '')} at a time)",
            f"{b['deny_all_s']:.2f}",
            "s",
        ),
        (f"  ... until all {n} workflows closed", f"{b['closed_all_s']:.2f}", "s"),
        ("worker VmRSS after they closed", f"{b['worker_closed']['VmRSS'] / mib:.1f}", "MiB"),
    ]


def print_pending(rows: list[tuple[str, str, str]], n: int) -> None:
    width = max(len(r[0]) for r in rows)
    head = f"{f'{n} calls pending on one worker':<{width}}  {'value':>9}  unit"
    log(head)
    log("-" * len(head))
    for label, value, unit in rows:
        log(f"{label:<{width}}  {value:>9}  {unit}")


# -- main ----------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="approvals measured per mode (a)")
    ap.add_argument("--pending", type=int, default=1000, help="calls pending at once (b)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up approvals per mode / in (b)")
    ap.add_argument("--concurrency", type=int, default=50, help="starts/denials in flight (b)")
    ap.add_argument("--address", help="use an existing server instead of the embedded one")
    ap.add_argument("--namespace", default="default")
    ap.add_argument(
        "--default-server", action="store_true", help="embedded server without FAST_CONFIG"
    )
    ap.add_argument("--skip-latency", action="store_true", help="only part b")
    ap.add_argument("--skip-pending", action="store_true", help="only part a")
    ap.add_argument("--json", type=Path, help="where to write the raw numbers")
    ap.add_argument(
        "--log-level", default="INFO", help="exactcall's log level (JSON lines to a .log file)"
    )
    return ap.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    import temporalio

    from exactcall._server import FAST_CONFIG, DevServer
    from exactcall._worker import Connection, build_worker, connect

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = args.json or HERE / "results" / f"approvals-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    log_path = json_path.with_suffix(".log")
    worker_log = json_path.with_suffix(".worker.log")
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
        server = DevServer(fast=not args.default_server)
        server.start()
        address = server.address
        config["server"] = {
            "kind": "embedded",
            "version": temporal_version(),
            "address": address,
            "fast": server.fast,
            "dynamic_config": list(FAST_CONFIG) if server.fast else [],
            "command": server.command(),
        }
        log(f"server: embedded `temporal server start-dev` ({config['server']['version']})")
        log(f"        at {address}, in-memory SQLite, fast={server.fast}")
    server_pid = server._proc.pid if server is not None and server._proc is not None else None
    watch(server_pid)
    log(
        f"host: {config['cpus']} CPUs, Python {config['python']}, temporalio "
        f"{config['temporalio']}; logs: {log_path}, worker subprocess: {worker_log}"
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
                b = await many_pending(client, address, args, worker_log, server_pid)
                b["concurrency"] = args.concurrency
                result["pending"] = b
                log("")
                print_pending(pending_rows(b), args.pending)
            config["loadavg_end"] = os.getloadavg()
            save()
            log(f"load average after: {fmt_load(config['loadavg_end'])}")
            log(f"\nraw numbers: {json_path}\nlogs: {log_path}, {worker_log}")
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
