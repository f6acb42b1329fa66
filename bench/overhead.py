"""exactcall's overhead against bare Temporal, on one dev server, in one run.

    python bench/overhead.py                    # embedded dev server with exactcall's FAST_CONFIG
    python bench/overhead.py --default-server   # embedded dev server, stock dynamic config
    python bench/overhead.py --address host:7233
    python bench/overhead.py --profile          # where exactcall's extra time goes (see README)

The same ``async def work(n) -> dict`` runs as a plain activity (``bare_work``) and as an
exactcall tool (``ec_work``), on one in-process worker and one client that has
``exactcall.Plugin()`` (so both modes use the same data converter and sandbox). Bare and
exactcall rounds are interleaved (ABBA blocks) after a warm-up. Figures are printed and
written as JSON; nothing is asserted on time. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
import tracemalloc
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from exactcall._model import Intent, RecordInit, WireIntent
from exactcall.workflows import RECORD_WORKFLOW

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `python bench/overhead.py` puts it there already
    sys.path.insert(0, str(HERE))

from _accounting import RECORD_DELAY, records_living  # noqa: E402
from _guard import watch  # noqa: E402

MODES = ("bare", "exactcall")
# issue 17's targets, exactcall over bare
LATENCY_TARGET = 1.2  # one call per workflow, latency, at most
SEQUENTIAL_TARGET = 1.25  # ms per call of sequential calls in one workflow, at most
THROUGHPUT_TARGET = 0.85  # throughput (see the charged ratio of phase 5), at least
MEMORY_METHOD = (
    "tracemalloc peak of Python allocations (client + worker, same process) during one extra, "
    "untimed concurrent round per mode; allocations of the Rust core are not included"
)


# -- helpers -------------------------------------------------------------------------------
def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50": statistics.median(ms),
        "p95": pct(ms, 95),
        "mean": statistics.fmean(ms),
        "min": min(ms),
        "max": max(ms),
    }


def abba(i: int, modes: Sequence[str] = MODES) -> Sequence[str]:
    """Block order: A B, B A, A B, ... so neither mode always runs first."""
    return modes if i % 2 == 0 else modes[::-1]


def server_cpu_s(pid: int | None) -> float | None:
    """utime + stime of a process, from /proc (Linux)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def temporal_version() -> str:
    from exactcall.embedded._server import temporal_binary

    try:
        out = subprocess.run(
            [temporal_binary(), "--version"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip()
    except Exception as exc:  # only printed
        return f"unknown ({exc})"


def fmt_load(load: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def log(msg: str = "") -> None:
    print(msg, flush=True)


# -- runs ----------------------------------------------------------------------------------
@dataclass
class CpuMeter:
    """CPU time of this process (every thread: asyncio, workflow threads, the Rust core) and
    of the dev server, minus what each burns when idle (pollers, the server's own loops)."""

    server_pid: int | None
    idle_process: float = 0.0  # CPU seconds per wall second, idle
    idle_server: float = 0.0

    def snap(self) -> tuple[float, float, float | None]:
        return time.perf_counter(), time.process_time(), server_cpu_s(self.server_pid)

    async def calibrate(self, seconds: float = 2.0) -> None:
        before = self.snap()
        await asyncio.sleep(seconds)
        after = self.snap()
        wall = after[0] - before[0]
        self.idle_process = (after[1] - before[1]) / wall
        if before[2] is not None and after[2] is not None:
            self.idle_server = (after[2] - before[2]) / wall

    def per_op_ms(self, before: tuple, after: tuple, ops: int) -> dict[str, float]:
        wall = after[0] - before[0]
        out = {
            "cpu_ms_per_call_process": (after[1] - before[1] - self.idle_process * wall)
            * 1000
            / ops,
            "cpu_ms_per_call_process_raw": (after[1] - before[1]) * 1000 / ops,
        }
        if before[2] is not None and after[2] is not None:
            out["cpu_ms_per_call_server"] = (
                (after[2] - before[2] - self.idle_server * wall) * 1000 / ops
            )
            out["cpu_ms_per_call_server_raw"] = (after[2] - before[2]) * 1000 / ops
        return out


@dataclass
class Bench:
    client: Any
    task_queue: str
    meter: CpuMeter
    timeout: float = 120.0  # per workflow: a stuck run fails the bench instead of hanging it
    last_id: str = ""  # the workflow id of the last run_one that finished
    tool: str = "ec_work"  # exactcall's tool: ec_work, or ec_work_pi (provider-idempotent)

    def workflow(self, mode: str) -> Any:
        from _bench_workflows import BareCalls, ExactCalls

        return BareCalls.run if mode == "bare" else ExactCalls.run

    async def run_one(self, mode: str, count: int, task_queue: str | None = None) -> float:
        """start_workflow -> result of one workflow doing ``count`` calls, in seconds."""
        t0 = time.perf_counter()
        handle = await self.client.start_workflow(
            self.workflow(mode),
            args=[count] if mode == "bare" else [count, self.tool],
            id=f"bench-{mode}-{uuid.uuid4().hex}",
            task_queue=task_queue or self.task_queue,
        )
        await asyncio.wait_for(handle.result(), self.timeout)
        self.last_id = handle.id
        return time.perf_counter() - t0

    async def concurrent(
        self, mode: str, m: int, task_queue: str | None = None, settle: float = 0.0
    ) -> dict[str, Any]:
        """``m`` one-call workflows started at once; wall time to the last result. CPU is
        counted until ``settle`` seconds after it (work deferred past the last result)."""
        before = self.meter.snap()
        await asyncio.gather(*(self.run_one(mode, 1, task_queue) for _ in range(m)))
        wall = time.perf_counter() - before[0]
        if settle:
            await asyncio.sleep(settle)
        cpu = self.meter.per_op_ms(before, self.meter.snap(), m)
        return {"wall_s": wall, "calls_per_s": m / wall, **cpu}


async def measure(b: Bench, args: argparse.Namespace) -> dict[str, Any]:
    raw: dict[str, Any] = {}

    log(f"warm-up: {args.warmup} sequential + 1 concurrent round of {min(args.m, 50)} per mode")
    for mode in MODES:
        for _ in range(args.warmup):
            await b.run_one(mode, 1)
        await b.run_one(mode, min(args.k, 10))
        await b.concurrent(mode, min(args.m, 50))

    # 1. sequential single-call workflows, ABBA blocks
    log(f"1. sequential latency: {args.n} single-call workflows per mode, blocks of {args.block}")
    seq: dict[str, list[float]] = {m: [] for m in MODES}
    blocks = math.ceil(args.n / args.block)
    for i in range(blocks):
        size = min(args.block, args.n - i * args.block)
        for mode in abba(i):
            for _ in range(size):
                seq[mode].append(await b.run_one(mode, 1))
    raw["sequential_s"] = seq

    # 2. K sequential calls inside one workflow
    log(f"2. {args.k} sequential calls in one workflow, {args.reps} reps per mode")
    kwf: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.reps):
        for mode in abba(i):
            kwf[mode].append(await b.run_one(mode, args.k))
    raw["k_workflow_wall_s"] = kwf

    # 3. concurrent throughput
    log(f"3. throughput: {args.m} one-call workflows at once, {args.reps} reps per mode")
    conc: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for i in range(args.reps):
        for mode in abba(i):
            gc.collect()
            conc[mode].append(await b.concurrent(mode, args.m))
    raw["concurrent"] = conc

    # 4. memory: one untimed concurrent round per mode under tracemalloc
    mem: dict[str, dict[str, float]] = {}
    if not args.no_memory:
        log(f"4. memory: one untimed round of {args.m} concurrent workflows per mode, tracemalloc")
        # Started once and never stopped: on Python < 3.12.9, tracemalloc.stop() races with
        # allocations in other threads (CPython gh-128679) and the SDK's Rust threads allocate
        # all the time: two runs segfaulted in traceback_new right after a stop(). The process
        # ends with os._exit, so tracing is never torn down; clear_traces() zeroes the counts.
        tracemalloc.start()
        for mode in MODES:
            gc.collect()
            tracemalloc.clear_traces()
            await b.concurrent(mode, args.m)
            current, peak = tracemalloc.get_traced_memory()
            mem[mode] = {"peak_bytes": peak, "retained_bytes": current}
    raw["tracemalloc"] = mem
    return raw


def summarise(raw: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of the table: metric, bare, exactcall, ratio, target."""
    rows: list[dict[str, Any]] = []
    seq = {m: summary_ms(raw["sequential_s"][m]) for m in MODES}
    for stat in ("p50", "p95", "mean"):
        rows.append(
            {
                "metric": f"1 call/workflow, latency {stat} (ms)",
                "key": f"sequential_{stat}_ms",
                "bare": seq["bare"][stat],
                "exactcall": seq["exactcall"][stat],
                "target": ("<=", LATENCY_TARGET),
            }
        )
    kwf = {m: statistics.median(raw["k_workflow_wall_s"][m]) * 1000 / args.k for m in MODES}
    rows.append(
        {
            "metric": f"{args.k} calls in 1 workflow, ms/call (median of {args.reps})",
            "key": "k_workflow_ms_per_call",
            **kwf,
            "target": ("<=", SEQUENTIAL_TARGET),
        }
    )

    def med(mode: str, field: str) -> float | None:
        vals = [r[field] for r in raw["concurrent"][mode] if field in r]
        return statistics.median(vals) if vals else None

    rows.append(
        {
            "metric": f"{args.m} concurrent wfs, calls/s (median of {args.reps})",
            "key": "throughput_calls_per_s",
            "bare": med("bare", "calls_per_s"),
            "exactcall": med("exactcall", "calls_per_s"),
            "target": (">=", THROUGHPUT_TARGET),
        }
    )
    rows.append(
        {
            "metric": "  CPU ms/call, bench process (client+worker)",
            "key": "cpu_ms_per_call_process",
            "bare": med("bare", "cpu_ms_per_call_process"),
            "exactcall": med("exactcall", "cpu_ms_per_call_process"),
            "target": None,
        }
    )
    if med("bare", "cpu_ms_per_call_server") is not None:
        rows.append(
            {
                "metric": "  CPU ms/call, dev server process",
                "key": "cpu_ms_per_call_server",
                "bare": med("bare", "cpu_ms_per_call_server"),
                "exactcall": med("exactcall", "cpu_ms_per_call_server"),
                "target": None,
            }
        )
    if raw["tracemalloc"]:
        rows.append(
            {
                "metric": f"tracemalloc peak, {args.m} concurrent (MiB)",
                "key": "tracemalloc_peak_mib",
                "bare": raw["tracemalloc"]["bare"]["peak_bytes"] / 2**20,
                "exactcall": raw["tracemalloc"]["exactcall"]["peak_bytes"] / 2**20,
                "target": None,
            }
        )
    for r in rows:
        bare, ec = r["bare"], r["exactcall"]
        r["ratio"] = ec / bare if bare and ec is not None else None
        target = r["target"]
        if target is None or r["ratio"] is None:
            r["meets"] = None
        elif target[0] == "<=":
            r["meets"] = r["ratio"] <= target[1]
        else:
            r["meets"] = r["ratio"] >= target[1]
    return rows


def headline(
    rows: list[dict[str, Any]], acct: dict[str, Any] | None, run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The figures the README quotes: exactcall over bare, and the extra requests per call
    (in a K-call run: ``run``; and for one-call workflows: ``acct``)."""
    by_key = {r["key"]: r["ratio"] for r in rows}
    ratios = {
        "latency_p50": by_key.get("sequential_p50_ms"),
        "sequential": by_key.get("k_workflow_ms_per_call"),
        "throughput_window": by_key.get("throughput_calls_per_s"),
        "throughput_charged": acct.get("throughput_charged_ratio") if acct else None,
        "history_bytes": run.get("history_bytes_ratio") if run else None,
        "history_bytes_one_call": acct.get("history_bytes_ratio") if acct else None,
    }
    return {
        "ratios": {k: round(v, 3) if v is not None else None for k, v in ratios.items()},
        "extra_requests_per_call": run.get("extra_requests_per_call") if run else None,
        "extra_requests_per_one_call_workflow": (
            acct.get("extra_requests_per_call") if acct else None
        ),
    }


def print_headline(result: dict[str, Any]) -> None:
    acct = result["raw"].get("accounting")
    log("")
    log(
        "ratios (exactcall / bare): "
        + ", ".join(
            f"{k} {v:.2f}x" if v is not None else f"{k} -" for k, v in result["ratios"].items()
        )
    )
    run = result["raw"].get("accounting_run")
    if run:
        b, e = run["bare"], run["exactcall"]
        log(
            f"one workflow of {run['k']} calls: history bytes bare {b['history_bytes']}, "
            f"exactcall {e['history_bytes']} + claim and records {e['written_bytes']} "
            f"({run['history_bytes_ratio']:.2f}x)"
        )
        if "extra_requests_by_operation" in run:
            ops = ", ".join(f"{k} {v:+g}" for k, v in run["extra_requests_by_operation"].items())
            extra = run["extra_requests_per_call"]
            log(f"  server requests per call beyond bare's: {extra:+g} ({ops})")
    if acct:
        b, e = acct["bare"], acct["exactcall"]
        log(
            f"history bytes per call: bare {b['history_bytes']}, exactcall "
            f"{e['history_bytes']} + claim and record {e.get('record_history_bytes', 0)} "
            "(one-call workflows)"
        )
        if "extra_requests_by_operation" in acct:
            ops = ", ".join(f"{k} {v:+g}" for k, v in acct["extra_requests_by_operation"].items())
            log(
                f"one-call workflows: server requests per workflow beyond bare's: "
                f"{acct['extra_requests_per_call']:+g}, "
                f"{acct['extra_requests_with_polls']:+g} with the workers' polls and heartbeats "
                f"({ops}; requests counted {acct['metric_counts_each_request']:g}x per "
                "StartWorkflowExecution of bare, i.e. once)"
            )


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max(len(r["metric"]) for r in rows)
    head = f"{'metric':<{width}}  {'bare':>9}  {'exactcall':>9}  {'ratio':>6}  {'target':>7}  met"
    log(head)
    log("-" * len(head))
    for r in rows:
        target = f"{r['target'][0]}{r['target'][1]:.2f}x" if r["target"] else ""
        met = {True: "yes", False: "NO", None: ""}[r["meets"]]
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
        log(
            f"{r['metric']:<{width}}  {fmt(r['bare']):>9}  {fmt(r['exactcall']):>9}  "
            f"{ratio:>6}  {target:>7}  {met}"
        )


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


# -- profile: an instrumented copy of the tool activity ------------------------------------
@dataclass(frozen=True)
class Variant:
    """A change to the package's protocol (the first attempt's fast path only). The package
    claims the record and sends the pre-call heartbeat at once, and the attempt that claimed
    the record completes its activity by task token (the completion is the done marker);
    each flag undoes or changes one of those."""

    name: str
    sequential: bool = False  # claim, then the pre-call heartbeat (before the gather)
    no_beat: bool = False  # no pre-call heartbeat (changes the protocol: see README)
    done_marker: bool = False  # write "done" to the record as well (the 0.x protocol)
    no_claim: bool = False  # neither the claim nor the pre-call heartbeat (a bound: unsafe)
    run_claims: bool = False  # the package's default: one claim per run (the others: per call)


VARIANTS = (
    Variant("per-run claim (package default)", run_claims=True),
    Variant("per-call claim (run_claims=False)"),
    Variant("claim, then heartbeat", sequential=True),
    Variant("no pre-call heartbeat", no_beat=True),
    Variant("done marker too (0.x)", done_marker=True),
    Variant("no claim, no heartbeat (bound)", no_claim=True),
)


@dataclass
class Sink:
    """What the instrumented copy measured, per config."""

    stages: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    last_intent: Any = None

    def clear(self) -> None:
        self.stages.clear()


def timed_activity_factory() -> Callable[[Any, Variant, Sink], Callable[..., Awaitable[Any]]]:
    """Subclasses of exactcall's Attempt and Record that time each step (imported late; the
    package is not edited). Variants change only the fast path of a first attempt."""
    from temporalio import activity

    from exactcall.activities._calling import REPORTED, ToolCall
    from exactcall.activities._decision import Decision
    from exactcall.activities._markers import Markers
    from exactcall.activities._records import Record
    from exactcall.activities._runner import Attempt

    class TimedRecord(Record):
        def __init__(self, client: Any, intent: Any, variant: Variant, sink: Sink) -> None:
            super().__init__(client, intent)
            self.variant, self.sink = variant, sink

        async def claim(self, owner: Any, attempt: int) -> bool:
            t0 = time.perf_counter()
            try:
                return await super().claim(owner, attempt)
            finally:
                self.sink.stages["claim: start record wf RPC"].append(time.perf_counter() - t0)

        async def mark(self, event: Any, *, tries: int = 5) -> None:
            t0 = time.perf_counter()
            try:
                await super().mark(event, tries=tries)
            finally:
                self.sink.stages[f"mark {event.kind}: signal RPC"].append(time.perf_counter() - t0)

    class TimedMarkers(Markers):
        variant: Variant
        sink: Sink

        async def beat(self, details: dict[str, Any], *a: Any, **kw: Any) -> None:
            if self.variant.no_beat and details.get("phase") == "calling":
                return
            t0 = time.perf_counter()
            try:
                await super().beat(details, *a, **kw)
            finally:
                self.sink.stages["heartbeat RPC (sync)"].append(time.perf_counter() - t0)

    class TimedCall(ToolCall):
        variant: Variant
        sink: Sink

        async def _report(self, value: Any) -> bool:
            if self.variant.done_marker:
                return False
            t0 = time.perf_counter()
            try:
                return await super()._report(value)
            finally:
                self.sink.stages["complete by task token RPC"].append(time.perf_counter() - t0)

        async def _tell_a_parked_reconciliation(self, value: Any) -> None:
            if self.variant.done_marker:  # 0.x had no reconciliation to tell (it would wait)
                return
            await super()._tell_a_parked_reconciliation(value)

        async def _invoke(self, beat_phase: str) -> Any:
            t0 = time.perf_counter()
            try:
                return await super()._invoke(beat_phase)
            finally:
                self.sink.stages["invoke tool (+keepalive task)"].append(time.perf_counter() - t0)

    class TimedAttempt(Attempt):
        markers_type = TimedMarkers

        def __init__(self, t: Any, intent: Any, variant: Variant, sink: Sink) -> None:
            super().__init__(t, intent, run_claims=variant.run_claims)
            self.variant, self.sink = variant, sink
            m = self.markers
            assert isinstance(m, TimedMarkers)
            m.variant, m.sink = variant, sink
            m.record = TimedRecord(activity.client(), intent, variant, sink)

        def _check_intent(self) -> None:
            t0 = time.perf_counter()
            super()._check_intent()
            self.sink.stages["check intent (hash, key)"].append(time.perf_counter() - t0)

        async def _claim_and_beat(self) -> bool:
            t0 = time.perf_counter()
            if self.variant.no_claim:  # what the rest of a call costs: not a protocol
                return True
            if not self.variant.sequential:
                try:
                    return await super()._claim_and_beat()
                finally:
                    self.sink.stages["claim || heartbeat"].append(time.perf_counter() - t0)
            # before the gather: claim, and only once the record exists the heartbeat
            m = self.markers
            claimed = await m.record.claim(m.owner, self.info.attempt)
            if claimed:
                await m.beat(m.calling())
            self.sink.stages["claim, then heartbeat"].append(time.perf_counter() - t0)
            return claimed

        def tool_call(self, d: Decision) -> ToolCall:
            call = TimedCall(self.markers, owns=d.owns, fast=d.fast)
            call.variant, call.sink = self.variant, self.sink
            return call

    def timed_activity(t: Any, variant: Variant, sink: Sink) -> Callable[..., Awaitable[Any]]:
        async def run(wire: WireIntent) -> Any:
            t0 = time.perf_counter()
            info = activity.info()
            intent = wire.complete(
                workflow_type=info.workflow_type or "", task_queue=info.task_queue
            )
            attempt = TimedAttempt(t, intent, variant, sink)
            sink.stages["attempt init"].append(time.perf_counter() - t0)
            sink.last_intent = intent
            try:
                result = await attempt.run()
            finally:
                sink.stages["activity total"].append(time.perf_counter() - t0)
            if result is REPORTED:
                activity.raise_complete_async()
            return result

        return activity.defn(name=t.name)(run)

    return timed_activity


def sample_intent(i: int, task_queue: str, prefix: str = "bench-exactcall") -> Intent:
    """The intent exactcall.call builds for ``ec_work(i)`` (what intent_of does)."""
    import exactcall
    from exactcall._canonical import args_hash, derive_key

    t = exactcall.get_tool("ec_work")
    canonical = t.canonical_args((i,), {})
    wid = f"{prefix}-{i:032x}"
    return Intent(
        tool=t.name,
        tool_version=t.version,
        args=canonical,
        args_hash=args_hash(t.name, canonical),
        namespace="default",
        workflow_id=wid,
        workflow_type="ExactCalls",
        step=f"ec_work#{i}",
        key=derive_key("default", wid, f"ec_work#{i}", t.name, t.version),
        record_task_queue=task_queue,
    )


def pure_costs(iterations: int = 2000) -> dict[str, float]:
    """µs per call of pure code exactcall adds: in the workflow, the payload, the log line."""
    import structlog
    from temporalio.contrib.pydantic import pydantic_data_converter

    import exactcall

    t = exactcall.get_tool("ec_work")
    conv = pydantic_data_converter.payload_converter

    def intent(i: int) -> Intent:
        return sample_intent(i, "bench-tq")

    def timed(fn: Callable[[int], Any], n: int = iterations) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        return (time.perf_counter() - t0) * 1e6 / n

    sample = intent(1)
    logger = structlog.get_logger("exactcall-bench")

    def log_line(i: int) -> None:
        logger.bind(
            tool=sample.tool,
            step=sample.step,
            key=sample.key,
            workflow_id=sample.workflow_id,
            args_hash=sample.args_hash,
            attempt=1,
        ).info("tool.executed")

    return {
        "intent_of: canonical args, hash, key, Intent (us)": timed(intent),
        "encode the tool input, WireIntent (us)": timed(
            lambda i: conv.to_payloads([sample.wire(sample.record_task_queue)])
        ),
        "encode int payload, bare (us)": timed(lambda i: conv.to_payloads([i])),
        "tool input, WireIntent (bytes)": float(
            len(conv.to_payloads([sample.wire(sample.record_task_queue)])[0].data)
        ),
        "the full Intent, as before (bytes)": float(len(conv.to_payloads([sample])[0].data)),
        "return adapter (dict) (us)": timed(lambda i: t.return_adapter().validate_python({})),
        "one INFO log line, as configured (us)": timed(log_line, 500),
    }


async def rpc_costs(client: Any, meter: CpuMeter, n: int = 200) -> dict[str, dict[str, float]]:
    """Latency and CPU of the RPCs a call adds, one at a time, with no worker on the queue:
    the record start as the package's Record.claim sends it, a bare start of the same input,
    and a marker signal (Record.mark, as the package sends it; the happy path sends none)."""
    # the package's lifetime here (the profile shortens it): marks go to open records
    with records_living(timedelta(minutes=5)):
        return await _rpc_costs(client, meter, n)


async def _rpc_costs(client: Any, meter: CpuMeter, n: int) -> dict[str, dict[str, float]]:
    from exactcall._model import Owner, RecordEvent
    from exactcall.activities._records import Record

    tq = f"bench-noworker-{uuid.uuid4().hex[:8]}"
    prefix = f"bench-rpc-{uuid.uuid4().hex[:8]}"  # fresh keys: a second run must not collide
    owner = Owner(run_id="bench-run", activity_id="ec_work#1")
    intents = [sample_intent(i, tq, prefix) for i in range(n)]
    records = [Record(client, intent) for intent in intents]

    async def claim(i: int) -> None:
        assert await records[i].claim(owner, 1)

    async def plain_start(i: int) -> None:
        await client.start_workflow(
            RECORD_WORKFLOW,
            RecordInit(intent=intents[i], owner=owner, attempt=1),
            id=records[i].id + "-p",
            task_queue=tq,
            start_delay=timedelta(days=1),
        )

    async def signal(i: int) -> None:
        await records[i].mark(RecordEvent(kind="done", owner=owner, attempt=1, result={"n": i}))

    out: dict[str, dict[str, float]] = {}
    for name, op in (
        ("start record wf, Record.claim", claim),
        ("start record wf, no summary/timeout", plain_start),
        ("signal a marker, Record.mark", signal),
    ):
        lat: list[float] = []
        before = meter.snap()
        for i in range(n):
            t0 = time.perf_counter()
            await op(i)
            lat.append(time.perf_counter() - t0)
        cpu = meter.per_op_ms(before, meter.snap(), n)
        out[name] = {"p50_ms": summary_ms(lat)["p50"], **cpu}
    return out


async def profile(
    args: argparse.Namespace,
    address: str,
    server_pid: int | None,
    done: Callable[[dict[str, Any]], None],
) -> None:
    """Run the profile; ``done(figures)`` is called before the workers shut down (a crash at
    worker shutdown, sdk-python #300, must not lose the figures)."""
    from _bench_workflows import BareCalls, ExactCalls, bare_work

    import exactcall
    from exactcall._worker import Connection, build_worker, connect
    from exactcall.activities._records import Record

    timed_activity = timed_activity_factory()
    tool = exactcall.get_tool("ec_work")
    conn = Connection(address=address, namespace=args.namespace)
    main_client = await connect(conn)
    run_id = uuid.uuid4().hex[:8]
    settle = RECORD_DELAY.total_seconds() + 0.5
    m = args.profile_m
    # label -> (task queue, mode, sink, client)
    configs: dict[str, tuple[str, str, Sink, Any]] = {}
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(records_living(RECORD_DELAY))  # they close in the window
        tq = f"bench-prof-{run_id}"
        await stack.enter_async_context(
            build_worker(main_client, tq, [BareCalls, ExactCalls], activities=[bare_work])
        )
        configs["bare"] = (tq, "bare", Sink(), main_client)
        configs["exactcall (package)"] = (tq, "exactcall", Sink(), main_client)
        only = [o.strip() for o in (args.only or "").split(",") if o.strip()]
        for v in VARIANTS:
            if only and not any(o in v.name for o in only):
                continue
            plugin = exactcall.Plugin(tools=[])
            client = await connect(conn, plugin)
            sink = Sink()
            vtq = f"bench-prof-{run_id}-{len(configs)}"
            await stack.enter_async_context(
                build_worker(client, vtq, [ExactCalls], activities=[timed_activity(tool, v, sink)])
            )
            configs[v.name] = (vtq, "exactcall", sink, client)
        b = Bench(main_client, tq, CpuMeter(server_pid))
        await b.meter.calibrate()
        labels = list(configs)

        def rotated(i: int) -> list[str]:
            return labels[i % len(labels) :] + labels[: i % len(labels)]

        log(f"profile warm-up: {args.warmup} calls + 1 concurrent round of 20 per config")
        for label in labels:
            tq_, mode, *_ = configs[label]
            for _ in range(args.warmup):
                await b.run_one(mode, 1, tq_)
            await b.concurrent(mode, 20, tq_)
        await asyncio.sleep(settle)
        for _, _, sink, _ in configs.values():
            sink.clear()

        n = args.profile_n
        log(f"profile: {n} sequential single-call workflows per config, rotating blocks")
        seq: dict[str, list[float]] = {label: [] for label in labels}
        for i in range(math.ceil(n / args.block)):
            size = min(args.block, n - i * args.block)
            for label in rotated(i):
                tq_, mode, *_ = configs[label]
                for _ in range(size):
                    seq[label].append(await b.run_one(mode, 1, tq_))
        stages = {
            label: {k: summary_ms(v) for k, v in sink.stages.items()}
            for label, (_, _, sink, _) in configs.items()
        }

        # every variant's record holds the same markers: one more call per config, its record
        # read from history right after the call and again once a delayed record has run
        checks: dict[str, Any] = {}
        for label, (tq_, mode, sink, client) in configs.items():
            if sink.last_intent is None:
                continue
            await b.run_one(mode, 1, tq_)
            record = Record(client, sink.last_intent)
            now = await record.read()
            await asyncio.sleep(settle)
            later = await record.read()
            checks[label] = {
                "phase_after_call": now.state.phase if now else None,
                "closed_after_call": now.closed if now else None,
                "closed_after_settle": later.closed if later else None,
            }

        log(f"profile: one workflow of {args.k} sequential calls per config")
        kwf: dict[str, float] = {}
        for label in rotated(1):
            tq_, mode, *_ = configs[label]
            kwf[label] = await b.run_one(mode, args.k, tq_) / args.k
        await asyncio.sleep(settle)

        log(
            f"profile: {m} concurrent one-call workflows per config, {args.reps} reps "
            f"(CPU counted until {settle:g}s after the last result)"
        )
        conc: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
        for i in range(args.reps):
            for label in rotated(i):
                tq_, mode, *_ = configs[label]
                gc.collect()
                conc[label].append(await b.concurrent(mode, m, tq_, settle=settle))

        rpcs = await rpc_costs(main_client, b.meter) if server_pid is not None else {}

        done(
            {
                "rpc_costs": rpcs,
                "sequential_s": seq,
                "k_workflow_s_per_call": kwf,
                "stages_ms": stages,
                "record_checks": checks,
                "concurrent": conc,
                "pure_costs": pure_costs(),
            }
        )


def print_profile(p: dict[str, Any], args: argparse.Namespace) -> None:
    log("\nper config: 1-call workflow latency (ms), K-call workflow (ms/call), throughput")
    head = (
        f"{'config':<28} {'p50':>6} {'p95':>6} {'mean':>6} {'xbare':>5} "
        f"{'K/call':>6} {'xbare':>5} {'call/s':>6} {'xbare':>5} {'cpu proc':>8} {'srv':>5}"
    )
    log(head)
    log("-" * len(head))
    bare_seq = summary_ms(p["sequential_s"]["bare"])
    bare_k = p["k_workflow_s_per_call"]["bare"]
    bare_tp = statistics.median(r["calls_per_s"] for r in p["concurrent"]["bare"])
    for label, lat in p["sequential_s"].items():
        s = summary_ms(lat)
        runs = p["concurrent"][label]
        k = p["k_workflow_s_per_call"][label]
        tp = statistics.median(r["calls_per_s"] for r in runs)
        cpu = statistics.median(r["cpu_ms_per_call_process"] for r in runs)
        srv_vals = [r["cpu_ms_per_call_server"] for r in runs if "cpu_ms_per_call_server" in r]
        srv = f"{statistics.median(srv_vals):.1f}" if srv_vals else "-"
        log(
            f"{label:<28} {s['p50']:6.1f} {s['p95']:6.1f} {s['mean']:6.1f} "
            f"{s['p50'] / bare_seq['p50']:4.2f}x {k * 1000:6.1f} {k / bare_k:4.2f}x "
            f"{tp:6.1f} {tp / bare_tp:4.2f}x {cpu:8.2f} {srv:>5}"
        )
    log(f"(throughput: median of {args.reps} rounds of {args.profile_m}; cpu: ms per call)")
    log("\ninside the tool activity, sequential runs (ms, p50 / p95)")
    for label, stages in p["stages_ms"].items():
        if not stages:
            continue
        log(f"  {label}")
        for stage, s in stages.items():
            log(f"    {stage:<34} {s['p50']:7.2f} / {s['p95']:7.2f}")
    log("\nrecord of the last call, read from its history")
    for label, c in p["record_checks"].items():
        log(
            f"  {label:<28} phase {c['phase_after_call']}, closed {c['closed_after_call']} "
            f"right after the call, closed {c['closed_after_settle']} later"
        )
    if p["rpc_costs"]:
        log("\nRPCs one at a time, no worker on the queue (p50 ms; CPU ms per RPC)")
        for name, r in p["rpc_costs"].items():
            log(
                f"  {name:<40} {r['p50_ms']:6.2f}   cpu proc {r['cpu_ms_per_call_process']:5.2f}"
                f"   server {r.get('cpu_ms_per_call_server', float('nan')):5.2f}"
            )
    log("\npure code, outside a workflow (per call)")
    for k, v in p["pure_costs"].items():
        log(f"  {k:<52} {v:9.1f}")


def setup_logging(level: str, path: Path) -> None:
    """As `exactcall worker` does (JSON lines), but into a file so the figures stay readable."""
    import logging

    from exactcall._log import configure_logging

    configure_logging(level.upper(), json_output=True)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(path.open("w"))  # open until os._exit


# -- main ----------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="sequential single-call wfs per mode")
    ap.add_argument("--k", type=int, default=100, help="sequential calls in one workflow")
    ap.add_argument("--m", type=int, default=200, help="concurrent one-call workflows")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the K and M phases")
    ap.add_argument("--block", type=int, default=10, help="interleaving block size")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up calls per mode")
    ap.add_argument(
        "--default-server", action="store_true", help="embedded server without FAST_CONFIG"
    )
    ap.add_argument("--address", help="use an existing server instead of the embedded one")
    ap.add_argument(
        "--provider-idempotent",
        action="store_true",
        help="exactcall's tool is declared provider_idempotent (no pre-call heartbeat)",
    )
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--json", type=Path, help="where to write the raw numbers")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc round")
    ap.add_argument(
        "--accounting-n",
        type=int,
        default=50,
        help="one-call workflows per mode counted in phase 5 (requests, history bytes, charged "
        "CPU); 0 skips it",
    )
    ap.add_argument(
        "--log-level",
        default="INFO",
        help="exactcall's log level, as `exactcall worker` (INFO: one JSON line per call), "
        "written to a .log file beside the JSON",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="instead of the table: time the RPCs inside an attempt and try variants",
    )
    ap.add_argument("--profile-n", type=int, default=100, help="sequential wfs per config")
    ap.add_argument("--profile-m", type=int, default=100, help="concurrent wfs per config")
    ap.add_argument(
        "--only",
        help="profile only the variants whose name contains one of these comma-separated "
        "strings (bare and the package are always run)",
    )
    return ap.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    import temporalio

    from exactcall._worker import Connection, build_worker, connect
    from exactcall.embedded._server import FAST_CONFIG, DevServer, free_port

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = args.json or HERE / "results" / f"overhead-{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    log_path = json_path.with_suffix(".log")
    setup_logging(args.log_level, log_path)
    server: DevServer | None = None
    metrics_url: str | None = None  # the embedded server's Prometheus endpoint
    config: dict[str, Any] = {
        "python": platform.python_version(),
        "temporalio": temporalio.__version__,
        "cpus": os.cpu_count(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "memory_method": MEMORY_METHOD,
    }
    if args.address:
        address = args.address
        config["server"] = {"kind": "existing", "address": address}
        log(f"server: existing server at {address} (its dynamic config is not known here)")
    else:
        metrics_port = free_port()
        server = DevServer(
            fast=not args.default_server, extra_args=["--metrics-port", str(metrics_port)]
        )
        server.start()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        address = server.address
        dyn = list(FAST_CONFIG) if server.fast else []
        config["server"] = {
            "kind": "embedded",
            "version": temporal_version(),
            "address": address,
            "fast": server.fast,
            "dynamic_config": dyn,
            "command": server.command(),
        }
        log(f"server: embedded `temporal server start-dev` ({config['server']['version']})")
        log(f"        at {address}, in-memory SQLite, fast={server.fast}")
        if dyn:
            log("        dynamic config: " + ", ".join(dyn))
        else:
            log("        stock dynamic config (transfer queue poll limits 20/s, timer shift 1s)")
    server_pid = server._proc.pid if server is not None and server._proc is not None else None
    watch(server_pid)  # stop the server even if this process crashes (sdk-python #300)
    log(
        f"host: {config['cpus']} CPUs, Python {config['python']}, temporalio "
        f"{config['temporalio']}; worker: SDK defaults (100 concurrent activities and "
        "workflow tasks, 1000 cached workflows), sandboxed workflows, pydantic converter"
    )
    log(f"logs: exactcall/temporalio at {args.log_level.upper()}, JSON lines to {log_path}")
    config["loadavg_start"] = os.getloadavg()
    log(f"load average before: {fmt_load(config['loadavg_start'])} (other processes add noise)")

    def finish(result: dict[str, Any]) -> None:
        """Print the end of the run and write the JSON, before the workers shut down."""
        result["config"]["started"] = stamp
        result["config"]["loadavg_end"] = os.getloadavg()
        log(f"load average after: {fmt_load(result['config']['loadavg_end'])}")
        json_path.write_text(json.dumps(result, indent=1))
        log(f"\nraw numbers: {json_path}\nlogs: {log_path}")

    try:
        if args.profile:

            def profile_done(p: dict[str, Any]) -> None:
                print_profile(p, args)
                finish({"config": config, "profile": p})

            await profile(args, address, server_pid, profile_done)
        else:
            from _bench_workflows import BareCalls, ExactCalls, bare_work

            client = await connect(Connection(address=address, namespace=args.namespace))
            tq = f"bench-{uuid.uuid4().hex[:12]}"
            log(f"task queue: {tq}\n")
            worker = build_worker(client, tq, [BareCalls, ExactCalls], activities=[bare_work])
            t0 = time.perf_counter()
            async with worker:
                bench = Bench(client, tq, CpuMeter(server_pid))
                if args.provider_idempotent:
                    bench.tool = "ec_work_pi"
                await bench.meter.calibrate()
                raw = await measure(bench, args)
                if args.accounting_n:
                    from _accounting import account

                    log(
                        f"5. accounting: {args.accounting_n} one-call workflows per mode (server "
                        f"requests, history bytes), then {args.m} at once (CPU per call, with "
                        "the records' closing counted)"
                    )
                    raw["accounting"] = await account(bench, metrics_url, args.accounting_n, args.m)
                    from _accounting import account_run

                    log(f"5b. accounting: one workflow of {args.k} calls per mode")
                    raw["accounting_run"] = await account_run(bench, metrics_url, args.k)
                raw["idle_cpu_per_s"] = {
                    "process": bench.meter.idle_process,
                    "server": bench.meter.idle_server,
                }
                rows = summarise(raw, args)
                log(f"\nmeasured in {time.perf_counter() - t0:.0f}s; memory: {MEMORY_METHOD}\n")
                print_table(rows)
                summary = {
                    r["key"]: {k: r[k] for k in ("metric", "bare", "exactcall", "ratio", "meets")}
                    | {"target": list(r["target"]) if r["target"] else None}
                    for r in rows
                }
                result = {"config": config, "summary": summary, "raw": raw}
                result.update(headline(rows, raw.get("accounting"), raw.get("accounting_run")))
                print_headline(result)
                finish(result)
    finally:
        if server is not None:
            server.stop()
    return 0


async def amain_cancellable(args: argparse.Namespace) -> int:
    """amain, cancelled by SIGTERM or SIGINT so that it stops the embedded server."""
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
