"""What a namespace budget costs a call: the same exactcall tool with and without one.

    python bench/budget.py                  # embedded dev server (fast config)
    python bench/budget.py --address host:7233

``ec_work`` and ``ec_work_budgeted`` (bench/_bench_workflows.py) are the same function; the
second carries ``exactcall.Budget("bench-calls", limit=10**12)``, which no run reaches, so
each of its calls reserves 1 on the budget's ledger before it runs and spends it after.
On one server, in one run, interleaved (ABBA) after a warm-up:

* **sequential**: ms per call of ``--calls`` sequential calls in one workflow;
* **latency**: one call per workflow, start to result, p50 and p95;
* **requests**: the server's own ``service_requests`` count per call (frontend, this
  namespace, polls and worker heartbeats left out), over ``--calls`` calls in one workflow;
* **history bytes** per call: the caller's history, and for the budgeted tool the ledger's
  history too (the ledger's events are the budget's own, not the caller's).

Prints figures and writes them as JSON; asserts nothing on time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _accounting import WORKER_OWN, diff, history_bytes, scrape  # noqa: E402

from bench._bench_workflows import BENCH_BUDGET, ExactCalls  # noqa: E402
from exactcall._log import configure_logging  # noqa: E402
from exactcall._wire import budget_id  # noqa: E402
from exactcall._worker import Connection, build_worker, connect  # noqa: E402
from exactcall.embedded._server import DevServer, free_port  # noqa: E402

MODES = {"plain": "ec_work", "budgeted": "ec_work_budgeted"}


def abba(i: int) -> list[str]:
    return ["plain", "budgeted"] if i % 2 == 0 else ["budgeted", "plain"]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("WARNING")
    server = None
    metrics_url = None
    if args.address:
        address = args.address
    else:
        port = free_port()
        server = DevServer(fast=True, extra_args=["--metrics-port", str(port)])
        server.start()
        address = server.address
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    try:
        client = await connect(Connection(address=address))
        tq = f"bench-budget-{uuid.uuid4().hex[:8]}"
        ns = client.namespace
        out: dict[str, Any] = {
            "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
            "server": "existing " + address if args.address else "embedded dev server (fast)",
            "calls_per_workflow": args.calls,
            "rounds": args.rounds,
            "one_call_workflows_per_mode": args.latency_n,
        }
        async with build_worker(client, tq, [ExactCalls], max_concurrent_activities=50):

            async def run(mode: str, count: int) -> tuple[str, float]:
                wid = f"bench-budget-{mode}-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                await client.execute_workflow(
                    ExactCalls.run, args=[count, MODES[mode]], id=wid, task_queue=tq
                )
                return wid, time.perf_counter() - t0

            for mode in MODES:  # warm-up: the ledger starts, sandbox and caches are warm
                await run(mode, 5)

            if args.concurrent:
                out["concurrent"] = await concurrent_phase(client, tq, args)
                print(f"  concurrent: {json.dumps(out['concurrent'])}", flush=True)
            if args.skip_sequential:
                return out

            per_call: dict[str, list[float]] = {m: [] for m in MODES}
            for i in range(args.rounds):
                for mode in abba(i):
                    _, s = await run(mode, args.calls)
                    per_call[mode].append(s * 1000 / args.calls)
            out["sequential_ms_per_call"] = {
                m: round(statistics.median(v), 2) for m, v in per_call.items()
            }
            out["sequential_ratio"] = round(
                out["sequential_ms_per_call"]["budgeted"] / out["sequential_ms_per_call"]["plain"],
                3,
            )
            print(f"  sequential ms per call: {out['sequential_ms_per_call']}", flush=True)

            lat: dict[str, list[float]] = {m: [] for m in MODES}
            for i in range(args.latency_n):
                for mode in abba(i):
                    _, s = await run(mode, 1)
                    lat[mode].append(s * 1000)
            out["latency_ms"] = {
                m: {"p50": round(pct(v, 50), 2), "p95": round(pct(v, 95), 2)}
                for m, v in lat.items()
            }
            out["latency_p50_ratio"] = round(
                out["latency_ms"]["budgeted"]["p50"] / out["latency_ms"]["plain"]["p50"], 3
            )
            print(f"  one-call latency ms: {out['latency_ms']}", flush=True)

            ledger = budget_id(BENCH_BUDGET.name)
            accounting: dict[str, Any] = {}
            for mode in MODES:
                await asyncio.sleep(1.5)  # the previous mode's last requests are reported
                before = scrape(metrics_url, ns) if metrics_url else None
                ledger_before = await history_bytes(client, ledger)
                wid, _ = await run(mode, args.calls)
                row: dict[str, Any] = {
                    "history_bytes_per_call": (await history_bytes(client, wid)) / args.calls
                }
                ledger_grew = await history_bytes(client, ledger) - ledger_before
                if mode == "budgeted":
                    # a continue-as-new during the run would make this negative: say so
                    row["ledger_history_bytes_per_call"] = (
                        ledger_grew / args.calls if ledger_grew >= 0 else None
                    )
                if before is not None and metrics_url:
                    await asyncio.sleep(1.5)
                    req = diff(scrape(metrics_url, ns), before)
                    row["requests_per_call"] = {
                        op: round(v / args.calls, 3)
                        for op, v in sorted(req.items())
                        if op not in WORKER_OWN and v / args.calls >= 0.005
                    }
                    row["requests_per_call_total"] = round(
                        sum(v for op, v in req.items() if op not in WORKER_OWN) / args.calls, 3
                    )
                accounting[mode] = row
            out["accounting"] = accounting
            if "requests_per_call_total" in accounting["plain"]:
                out["extra_requests_per_call"] = round(
                    accounting["budgeted"]["requests_per_call_total"]
                    - accounting["plain"]["requests_per_call_total"],
                    3,
                )
            print(f"  accounting: {json.dumps(accounting)}", flush=True)
        out["load_average"] = os.getloadavg()
        return out
    finally:
        if server is not None:
            server.stop()


async def at_once(client: Client, tq: str, mode: str, m: int, timeout: float) -> dict[str, Any]:
    """``m`` one-call workflows started at once: calls/s to the last result, and what failed
    (a workflow that failed, or was not done within ``timeout``, is not counted as done)."""
    from exactcall.activities import _budget as batcher

    before = dict(batcher.STATS)
    wids = [f"bench-at-once-{mode}-{uuid.uuid4().hex[:8]}-{i}" for i in range(m)]
    waits = asyncio.Semaphore(400)  # never thousands of result long-polls at once
    t0 = time.perf_counter()
    handles = await asyncio.gather(
        *(
            client.start_workflow(ExactCalls.run, args=[1, MODES[mode]], id=w, task_queue=tq)
            for w in wids
        )
    )

    async def result(h: Any) -> str:
        async with waits:
            try:
                await h.result()
                return "done"
            except Exception as exc:  # a failed workflow: what reached the call
                return type(exc).__name__

    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*(result(h) for h in handles)), timeout)
        wall = time.perf_counter() - t0
    except TimeoutError:
        outcomes, wall = [], float("nan")
        for h in handles:
            with contextlib.suppress(Exception):
                await h.terminate("bench round timed out")
    done = sum(1 for o in outcomes if o == "done")
    return {
        "workflows": m,
        "done": done,
        "failed": len(outcomes) - done,
        "timed_out": m if not outcomes else 0,
        "seconds": round(wall, 3),
        "calls_per_s": round(done / wall, 1) if outcomes else 0.0,
        "ledger_rpcs": {k: v - before.get(k, 0) for k, v in batcher.STATS.items()},
    }


async def concurrent_phase(client: Client, tq: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--concurrent`` one-call workflows at once per mode, ABBA over ``--concurrent-rounds``
    (median calls/s), then ``--callers`` budgeted callers at once (and as many without)."""
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for i in range(args.concurrent_rounds):
        for mode in abba(i):
            r = await at_once(client, tq, mode, args.concurrent, args.round_timeout)
            rounds[mode].append(r)
            print(f"    {mode} x{args.concurrent}: {json.dumps(r)}", flush=True)
    med = {m: statistics.median(r["calls_per_s"] for r in v) for m, v in rounds.items()}
    out: dict[str, Any] = {
        "rounds": rounds,
        "calls_per_s_median": med,
        "throughput_ratio": round(med["budgeted"] / med["plain"], 3) if med["plain"] else None,
    }
    if args.callers:
        big: dict[str, Any] = {}
        for mode in ("plain", "budgeted"):
            big[mode] = await at_once(client, tq, mode, args.callers, args.round_timeout)
            print(f"    {mode} x{args.callers}: {json.dumps(big[mode])}", flush=True)
        out["callers"] = big
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=50, help="sequential calls per workflow")
    ap.add_argument("--rounds", type=int, default=8, help="ABBA rounds of sequential calls")
    ap.add_argument("--latency-n", type=int, default=60, help="one-call workflows per mode")
    ap.add_argument("--concurrent", type=int, default=200, help="one-call workflows at once")
    ap.add_argument("--concurrent-rounds", type=int, default=4, help="ABBA rounds of those")
    ap.add_argument("--callers", type=int, default=1000, help="budgeted callers at once")
    ap.add_argument("--round-timeout", type=float, default=180.0, help="seconds per round")
    ap.add_argument("--skip-sequential", action="store_true", help="concurrent phase only")
    ap.add_argument("--address", help="an existing server instead of the embedded one")
    ap.add_argument("--json", type=Path, help="where to write the numbers")
    return ap.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    res = asyncio.run(main(a))
    path = a.json or HERE / "results" / f"budget-{res['when']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    print(f"written to {path}")
