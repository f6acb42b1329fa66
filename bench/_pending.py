"""Part b of ``bench/approvals.py``: many calls pending on ONE worker, exactcall and bare.

One phase per flavour, each with its own worker subprocess and task queue on the same server:
``bare`` (``bench._bare_pending``: a plain ``temporalio`` worker, a workflow that publishes a
memo and the ``ExactcallPending`` search attribute by hand and waits on a signal) first, then
``exactcall`` (``python -m exactcall worker``, ``ApprovedCall``: one
``@exactcall.tool(approval=True)`` call). The bare phase runs first so that a server holding
more closed workflows slows exactcall's phase, not bare's; ``--bare-last`` swaps the order, to
see how much of a second phase's time is the server's (its JSON says ``"phase"``).

The bench never waits on many results at once: every "until all" is a ``count_workflows``
poll, and results are fetched afterwards, a few at a time (10,000 ``handle.result()`` long
polls at once exceed the dev server's per-namespace long-poll limit, ``frontend.namespaceCount``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from _guard import watch
from overhead import log, server_cpu_s

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOOLS_MODULE = "bench._approval_tools"
WORKFLOWS_MODULE = "bench._approval_workflows"
BY = "bench"


# -- helpers -------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, in KiB, its CPU time in ms, and how long its
    threads waited for a CPU while runnable (``wait_ms``, from schedstat: other processes'
    load on a shared machine shows up here)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_ms"] = (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    out["wait_ms"] = run_delay_ms(pid)
    return out


def machine_cpu_s() -> float:
    """CPU time used by everything on this machine so far (all cores, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system . . irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def run_delay_ms(pid: int | None) -> int:
    """Time the threads of ``pid`` spent runnable but not running, in ms (0 if unknown)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat") if pid else ():
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total // 1_000_000


async def poll(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float, every: float
) -> tuple[T, int]:
    """Call ``fn`` until ``ok(value)``; the value and how many calls it took. Errors count as
    not yet (a query before the worker has the workflow); a stuck run fails after timeout."""
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


def spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A worker in its own session (SIGINT at the terminal reaches the bench only)."""
    with log_path.open("w") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def tuning_flags(args: Any) -> list[str]:
    """The worker settings under test, as flags of both workers."""
    out: list[str] = []
    for flag in ("max_cached_workflows", "workflow_task_pollers", "max_concurrent_activities"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag.replace('_', '-')}", str(value)]
    if getattr(args, "passthrough_all_modules", False):
        out.append("--passthrough-all-modules")
    return out


# -- the two flavours ----------------------------------------------------------------------
@dataclass
class Flavour:
    """What differs between bare Temporal and exactcall in part b."""

    name: str
    workflow: str
    marker: bytes  # in the worker's command line (for the watchdog)

    def command(self, address: str, namespace: str, tq: str, args: Any) -> list[str]:
        conn = ["--address", address, "--namespace", namespace, "--task-queue", tq]
        if self.name == "bare":
            return [sys.executable, "-m", "bench._bare_pending", *conn, *tuning_flags(args)]
        mods = ["--tools", TOOLS_MODULE, "--workflows", WORKFLOWS_MODULE]
        head = [sys.executable, "-m", "exactcall", "--log-level", "WARNING", "worker"]
        return [*head, *conn, *mods, *tuning_flags(args)]

    async def start(self, client: Any, wid: str, n: int, tq: str) -> None:
        await client.start_workflow(self.workflow, n, id=wid, task_queue=tq)

    async def listing(self, client: Any) -> dict[str, Any]:
        """Every pending call: workflow id -> what a decision needs (exactcall: the request)."""
        if self.name == "exactcall":
            from exactcall import approvals

            return {r.workflow_id: r for r in await approvals.list_pending(client)}
        from _bare_pending import MEMO

        out: dict[str, Any] = {}  # what bare code would do: list, decode each memo
        query = "ExactcallPending = true AND ExecutionStatus = 'Running'"
        async for wf in client.list_workflows(query):
            for req in (await wf.memo()).get(MEMO) or []:
                out[wf.id] = req
        return out

    async def decide(self, client: Any, wid: str, req: Any, verdict: str) -> None:
        handle = client.get_workflow_handle(wid)
        if self.name == "bare":
            from _bare_pending import SIGNAL

            await handle.signal(SIGNAL, verdict)
            return
        from exactcall import approvals

        d = approvals.Decision(
            decision=verdict, args_hash=req.args_hash, step=req.step, by=BY, reason="bench"
        )
        await handle.signal(approvals.DECIDE_SIGNAL, d)

    @staticmethod
    def requested_at(req: Any) -> float:
        from datetime import datetime

        at = req["requested_at"] if isinstance(req, dict) else req.requested_at
        return (datetime.fromisoformat(at) if isinstance(at, str) else at).timestamp()


FLAVOURS = {f.name: f for f in (Flavour("bare", "BarePending", b"_bare_pending"),)}
FLAVOURS["exactcall"] = Flavour("exactcall", "ApprovedCall", b"exactcall")


def expected(n: int, verdict: str) -> dict[str, Any]:
    return {"n": n} if verdict == "approve" else {"denied": True}


def verdict_of(i: int) -> str:
    return "approve" if i % 2 == 0 else "deny"


# -- one phase -----------------------------------------------------------------------------
class Phase:
    """N calls of one flavour pending on one worker subprocess: start, list, decide, close."""

    def __init__(self, flavour: Flavour, client: Any, address: str, args: Any, log_dir: Path):
        self.f, self.client, self.address, self.args = flavour, client, address, args
        run = uuid.uuid4().hex[:8]
        self.tq = f"bench-pending-{flavour.name}-{run}"
        self.prefix = f"{self.tq}-"
        self.worker_log = log_dir / f"{flavour.name}.worker.log"
        self.out: dict[str, Any] = {"pending": args.pending, "task_queue": self.tq}
        where = f"TaskQueue = '{self.tq}' AND WorkflowType = '{flavour.workflow}'"
        self.q_running = f"ExecutionStatus = 'Running' AND {where}"
        self.q_pending = f"ExactcallPending = true AND {self.q_running}"
        main = f"WorkflowId STARTS_WITH '{self.prefix}c'"
        self.q_completed = f"ExecutionStatus = 'Completed' AND {where} AND {main}"

    def wid(self, i: int, kind: str = "c") -> str:
        """``<prefix>c<i>`` for the calls measured, ``<prefix>w<i>`` for the warm-up."""
        return f"{self.prefix}{kind}{i}"

    async def count(self, query: str) -> int:
        return (await self.client.count_workflows(query)).count

    async def until_count(self, query: str, ok: Callable[[int], bool], timeout: float) -> int:
        _, polls = await poll(lambda: self.count(query), ok, timeout, self.args.poll)
        return polls

    def ours(self, listed: dict[str, Any], kind: str = "c") -> dict[str, Any]:
        own = f"{self.prefix}{kind}"
        return {k: v for k, v in listed.items() if k.startswith(own)}

    async def run(self, server_pid: int | None) -> dict[str, Any]:
        cmd = self.f.command(self.address, self.args.namespace, self.tq, self.args)
        self.out["worker_command"] = cmd
        log(f"b. [{self.f.name}] worker subprocess: {' '.join(cmd[1:])}")
        env = dict(os.environ)
        paths = (str(ROOT), str(HERE), os.environ.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        proc = spawn(cmd, env, self.worker_log)
        watch(proc.pid, self.f.marker)
        self.proc = proc
        try:
            await self._warm_up()
            await self._pending(server_pid)
            await self._listing()
            await self._decide_all(await self._samples())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # graceful: both workers stop on SIGTERM
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    await asyncio.to_thread(proc.wait)
            self.out["worker_exit_code"] = proc.returncode
        return self.out

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({self.proc.returncode}): {self.worker_log}")

    async def _warm_up(self) -> None:
        """A few calls made pending, denied and closed: imports, registration, caches."""
        t0, w = time.perf_counter(), self.args.warmup
        for i in range(w):
            await self.f.start(self.client, self.wid(i, "w"), i, self.tq)
        await self.until_count(self.q_pending, lambda c: c >= w, 120)
        listed, _ = await poll(
            lambda: self.f.listing(self.client), lambda r: len(self.ours(r, "w")) >= w, 60, 0.2
        )
        for wid, req in self.ours(listed, "w").items():
            await self.f.decide(self.client, wid, req, "deny")
        await self.until_count(self.q_running, lambda c: c == 0, 120)
        self.alive()
        self.out["worker_ready_s"] = time.perf_counter() - t0
        await asyncio.sleep(1.0)

    async def _pending(self, server_pid: int | None) -> None:
        n, out = self.args.pending, self.out
        before = out["worker_before"] = proc_status(self.proc.pid)
        log(
            f"b. [{self.f.name}] worker up (pid {self.proc.pid}): VmRSS "
            f"{before['VmRSS'] / 1024:.1f} MiB; starting {n} workflows"
        )
        t0, server0 = time.perf_counter(), server_cpu_s(server_pid)
        server_wait0, machine0, bench0 = run_delay_ms(server_pid), machine_cpu_s(), own_cpu_s()

        async def start(i: int) -> None:
            await self.f.start(self.client, self.wid(i), i, self.tq)

        await bounded(n, self.args.concurrency, start)
        t_started, wall_started = time.perf_counter(), time.time()
        out["start_all_s"] = t_started - t0
        timeout = max(300.0, n / 10)
        out["count_polls"] = await self.until_count(self.q_pending, lambda c: c >= n, timeout)
        out["counted_after_last_start_s"] = time.perf_counter() - t_started
        listed, polls = await poll(
            lambda: self.f.listing(self.client), lambda r: len(self.ours(r)) >= n, 120, 0.5
        )
        t_listed, wall_listed = time.perf_counter(), time.time()
        self.listed = self.ours(listed)
        out["list_polls"] = polls
        out["listed_after_last_start_s"] = t_listed - t_started
        out["listed_after_first_start_s"] = t_listed - t0
        last = max(self.f.requested_at(r) for r in self.listed.values())
        out["last_start_to_last_request_s"] = last - wall_started
        out["last_request_to_listed_s"] = wall_listed - last
        after = out["worker_pending"] = proc_status(self.proc.pid)
        server1, busy = server_cpu_s(server_pid), t_listed - t0
        out["worker_cores_busy"] = (after["cpu_ms"] - before["cpu_ms"]) / 1000 / busy
        out["worker_cores_waiting"] = (after["wait_ms"] - before["wait_ms"]) / 1000 / busy
        if server0 is not None and server1 is not None:
            out["server_cores_busy"] = (server1 - server0) / busy
            out["server_cores_waiting"] = (run_delay_ms(server_pid) - server_wait0) / 1000 / busy
            ours = (after["cpu_ms"] - before["cpu_ms"]) / 1000 + server1 - server0
            ours += own_cpu_s() - bench0
            out["others_cores_busy"] = (machine_cpu_s() - machine0 - ours) / busy
        dt = out["listed_after_last_start_s"]
        log(f"b. [{self.f.name}] all {n} listed {dt:.2f}s after the last start")

    async def _listing(self) -> None:
        """The listing, 3 interleaved rounds: in-process, and (exactcall) the CLI."""
        ns, n = self.args.namespace, self.args.pending
        in_process: list[float] = []
        cli: list[float] = []
        startup: list[float] = []
        for _ in range(3):
            t = time.perf_counter()
            listed = await self.f.listing(self.client)
            in_process.append(time.perf_counter() - t)
            self.out["list_count"] = len(self.ours(listed))
            if self.f.name != "exactcall":
                continue
            argv = ["approvals", "list", "--json", "--address", self.address, "--namespace", ns]
            dt, res = await asyncio.to_thread(run_cli, argv)
            if res.returncode != 0:
                raise RuntimeError(f"exactcall approvals list failed: {res.stderr[-2000:]}")
            cli.append(dt)
            rows = json.loads(res.stdout)
            self.out["cli_count"] = sum(r["workflow_id"].startswith(self.prefix) for r in rows)
            self.out["cli_rows"] = len(rows)
            self.out["cli_json_bytes"] = len(res.stdout)
            dt, _ = await asyncio.to_thread(run_cli, ["approvals", "list", "--help"])
            startup.append(dt)
        if self.out["list_count"] != n:
            raise RuntimeError(f"listed {self.out['list_count']} of {n} pending calls")
        self.out["list_s"] = in_process
        if cli:
            self.out["cli_list_s"], self.out["cli_startup_s"] = cli, startup

    async def _samples(self) -> set[int]:
        """Approve ``--sample`` of the first-started (evicted first when the cache is smaller
        than N) and of the last-started calls, one at a time: signal sent -> workflow closed."""
        n, k = self.args.pending, min(self.args.sample, self.args.pending // 2)
        oldest, newest = list(range(k)), list(range(n - k, n))
        rows: dict[str, list[dict[str, float]]] = {"oldest": [], "newest": []}
        for a, b in zip(oldest, newest, strict=True):
            for group, i in (("oldest", a), ("newest", b)):
                wid = self.wid(i)
                t0 = time.perf_counter()
                await self.f.decide(self.client, wid, self.listed[wid], "approve")
                t1 = time.perf_counter()
                result = await asyncio.wait_for(self.client.get_workflow_handle(wid).result(), 120)
                t2 = time.perf_counter()
                if result != expected(i, "approve"):
                    raise RuntimeError(f"{wid}: {result!r} after approval")
                rows[group].append({"signal_s": t1 - t0, "closed_s": t2 - t0})
        self.out["decision_samples"] = rows
        return set(oldest) | set(newest)

    async def _decide_all(self, done: set[int]) -> None:
        """Approve the even, deny the odd of the rest; wait (count polls) until all closed;
        then check every result, a few fetches at a time."""
        n, out = self.args.pending, self.out
        todo = [i for i in range(n) if i not in done]
        log(f"b. [{self.f.name}] deciding {len(todo)} (approve even, deny odd), then closing")
        before = proc_status(self.proc.pid)
        t0 = time.perf_counter()

        async def one(j: int) -> None:
            i = todo[j]
            wid = self.wid(i)
            await self.f.decide(self.client, wid, self.listed[wid], verdict_of(i))

        await bounded(len(todo), self.args.concurrency, one)
        out["decide_all_s"] = time.perf_counter() - t0
        await self.until_count(self.q_running, lambda c: c == 0, max(300.0, n / 10))
        out["closed_all_s"] = time.perf_counter() - t0
        closed = out["worker_closed"] = proc_status(self.proc.pid)
        out["worker_cpu_per_decision_ms"] = (closed["cpu_ms"] - before["cpu_ms"]) / len(todo)
        out["completed"] = await self.count(self.q_completed)
        t1 = time.perf_counter()

        async def check(i: int) -> bool:
            verdict = "approve" if i in done else verdict_of(i)
            result = await self.client.get_workflow_handle(self.wid(i)).result()
            return result == expected(i, verdict)

        ok = await bounded(n, 20, check)
        out["results_ok"] = sum(ok)
        out["results_bad"] = [self.wid(i) for i, good in enumerate(ok) if not good][:10]
        out["verify_s"] = time.perf_counter() - t1
        await asyncio.sleep(2.0)
        out["worker_end"] = proc_status(self.proc.pid)
        log(
            f"b. [{self.f.name}] closed {out['completed']} of {n}, results right: "
            f"{out['results_ok']}"
        )


async def many_pending(
    client: Any, address: str, args: Any, log_dir: Path, server_pid: int | None
) -> dict[str, dict[str, Any]]:
    """Both phases (bare first unless ``--bare-last``; none with ``--skip-bare``); raw figures
    per flavour, with the order they ran in (``"phase"``)."""
    names = ["exactcall"] if args.skip_bare else ["bare", "exactcall"]
    if args.bare_last:
        names.reverse()
    out = {}
    for i, name in enumerate(names, 1):
        out[name] = await Phase(FLAVOURS[name], client, address, args, log_dir).run(server_pid)
        out[name]["phase"] = i
    return out


# -- the table -----------------------------------------------------------------------------
def _ms(rows: Sequence[dict[str, float]], key: str, how: str) -> float:
    values = [r[key] * 1000 for r in rows]
    return statistics.median(values) if how == "p50" else max(values)


def figures(b: dict[str, Any]) -> list[tuple[str, float | None, str]]:
    """(label, value, unit) of one phase."""
    n, mib, med = b["pending"], 1024.0, statistics.median
    before, pend, end = b["worker_before"], b["worker_pending"], b["worker_end"]
    s = b["decision_samples"]
    rows: list[tuple[str, float | None, str]] = [
        (f"start {n} workflows", b["start_all_s"], "s"),
        (f"last start -> all {n} counted pending", b["counted_after_last_start_s"], "s"),
        (f"last start -> all {n} listed", b["listed_after_last_start_s"], "s"),
        ("  last start -> last call requested", b["last_start_to_last_request_s"], "s"),
        ("  worker CPU per call to reach pending", (pend["cpu_ms"] - before["cpu_ms"]) / n, "ms"),
        ("  worker CPU, first start -> all listed", b["worker_cores_busy"], "cores"),
        ("  worker runnable, waiting for a CPU", b.get("worker_cores_waiting"), "cores"),
        ("  server CPU, first start -> all listed", b.get("server_cores_busy"), "cores"),
        ("  server runnable, waiting for a CPU", b.get("server_cores_waiting"), "cores"),
        ("  other processes on the machine", b.get("others_cores_busy"), "cores"),
        ("worker VmRSS before", before["VmRSS"] / mib, "MiB"),
        (f"worker VmRSS with {n} pending", pend["VmRSS"] / mib, "MiB"),
        ("  per pending call (VmRSS delta / n)", (pend["VmRSS"] - before["VmRSS"]) / n, "KiB"),
        ("worker peak RSS over the run (VmHWM)", end["VmHWM"] / mib, "MiB"),
        (f"list all {n}, in-process (median of 3)", med(b["list_s"]), "s"),
    ]
    if "cli_list_s" in b:
        rows += [
            ("exactcall approvals list --json (median of 3)", med(b["cli_list_s"]), "s"),
            ("  CLI start-up alone (--help)", med(b["cli_startup_s"]), "s"),
        ]
    for group, what in (("oldest", "first-started"), ("newest", "last-started")):
        rows += [
            (f"approve one {what} call -> closed, p50", _ms(s[group], "closed_s", "p50"), "ms"),
            (f"  max of {len(s[group])} ({group})", _ms(s[group], "closed_s", "max"), "ms"),
        ]
    rows += [
        (f"decide the other {n - 2 * len(s['oldest'])} (send)", b["decide_all_s"], "s"),
        ("  ... until all closed", b["closed_all_s"], "s"),
        ("  worker CPU per decision", b["worker_cpu_per_decision_ms"], "ms"),
        (f"closed (of {n})", b["completed"], ""),
        (f"results right (of {n})", b["results_ok"], ""),
        ("worker VmRSS after they closed", end["VmRSS"] / mib, "MiB"),
    ]
    return rows


def print_table(phases: dict[str, dict[str, Any]], n: int) -> None:
    ec = figures(phases["exactcall"])
    bare = figures(phases["bare"]) if "bare" in phases else None
    width = max(len(r[0]) for r in ec)
    head = f"{f'{n} calls pending on one worker':<{width}}  {'exactcall':>9}"
    head += f"  {'bare':>9}  {'ratio':>6}  unit" if bare else "  unit"
    log(head)
    log("-" * len(head))
    bare_by = {r[0]: r[1] for r in bare} if bare else {}

    def fmt(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:.2f}"

    for label, value, unit in ec:
        line = f"{label:<{width}}  {fmt(value):>9}"
        if bare:
            other = bare_by.get(label)
            ratio = f"{value / other:.2f}" if value and other else "-"
            line += f"  {fmt(other):>9}  {ratio:>6}"
        log(f"{line}  {unit}")
