"""How long ``exactcall audit`` takes to list 10,000 calls, and how much memory it holds.

Makes ``--workflows`` runs of ``ExactCalls`` with ``--calls`` calls each on the embedded dev
server (or ``--address``), then, on the same server in the same run:

* **bare**: what reading those runs costs with Temporal alone: list them (visibility) and
  fetch every history, a few at a time, as the audit does, decoding nothing;
* **audit**: ``audit_rows`` over the same runs (listing, histories, every call's intent,
  outcome and approvals, as rows);
* **export**: ``export`` of the same rows to a file (hash chain, no signature).

Each is timed (first row and total) and measured with tracemalloc (peak) in a round of its
own; the ratio audit / bare is the audit's own cost. Prints figures; asserts nothing on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._bench_workflows import BareCalls, ExactCalls
from exactcall._log import configure_logging
from exactcall._worker import Connection, build_worker, connect
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows, export


async def make_runs(client: Any, prefix: str, workflows: int, calls: int) -> float:
    tq = f"bench-audit-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    async with build_worker(client, tq, [ExactCalls, BareCalls], max_concurrent_activities=200):
        sem = asyncio.Semaphore(50)

        async def one(i: int) -> None:
            async with sem:
                await client.execute_workflow(
                    ExactCalls.run, calls, id=f"{prefix}{i:05d}", task_queue=tq
                )

        await asyncio.gather(*(one(i) for i in range(workflows)))
    return time.perf_counter() - started


async def bare(client: Any, flt: AuditFilter) -> int:
    sem = asyncio.Semaphore(6)
    events = 0

    async def fetch(wid: str, run_id: str) -> int:
        async with sem:
            h = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
            return len(h.events)

    tasks = [
        asyncio.create_task(fetch(ex.id, ex.run_id))
        async for ex in client.list_workflows(flt.query())
    ]
    for t in tasks:
        events += await t
    return events


async def timed(fn: Callable[[], Awaitable[Any]], memory: bool) -> dict[str, Any]:
    if memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    value = await fn()
    total = time.perf_counter() - t0
    out: dict[str, Any] = {"seconds": round(total, 3), "value": value}
    if memory:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["peak_mib"] = round(peak / 2**20, 2)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("WARNING")  # one log line per call would be most of the bench's time
    server = None
    if args.address:
        address = args.address
    else:
        server = DevServer(fast=True)
        server.start()
        address = server.address
    try:
        client = await connect(Connection(address=address))
        prefix = f"bench-audit-{uuid.uuid4().hex[:6]}-"
        total = args.workflows * args.calls
        print(f"making {args.workflows} runs x {args.calls} calls = {total} calls ...", flush=True)
        made = await make_runs(client, prefix, args.workflows, args.calls)
        print(f"  made in {made:.1f} s", flush=True)
        flt = AuditFilter(workflow=prefix + "*")
        await asyncio.sleep(2)  # visibility catches up with the last closes

        first: dict[str, float] = {}

        async def audit() -> int:
            n = 0
            t0 = time.perf_counter()
            async for _ in audit_rows(client, flt):
                if n == 0:  # the first (untraced) round's is kept
                    first.setdefault("audit", time.perf_counter() - t0)
                n += 1
            return n

        async def exported() -> int:
            with tempfile.TemporaryFile("w+") as f:  # a real file: nothing accumulates
                return await export(client, flt, f, namespace="default", version="bench")

        results: dict[str, Any] = {}
        for name, fn in (
            ("bare", lambda: bare(client, flt)),
            ("audit", audit),
            ("export", exported),
        ):
            for memory in (False, True):
                r = await timed(fn, memory)
                results.setdefault(name, {}).update(
                    {"peak_mib": r["peak_mib"]}
                    if memory
                    else {"seconds": r["seconds"], "n": r["value"]}
                )
            print(f"  {name:<7} {results[name]}", flush=True)
        assert results["audit"]["n"] == total, results  # every call listed, none twice
        out = {
            "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
            "server": "existing " + address if args.address else "embedded dev server (fast)",
            "workflows": args.workflows,
            "calls_per_workflow": args.calls,
            "calls": total,
            "made_seconds": round(made, 1),
            "bare": results["bare"],
            "audit": {**results["audit"], "first_row_seconds": round(first["audit"], 3)},
            "export": results["export"],
            "audit_vs_bare_time": round(
                results["audit"]["seconds"] / results["bare"]["seconds"], 2
            ),
            "audit_calls_per_second": round(total / results["audit"]["seconds"]),
            "load_average": os.getloadavg(),
        }
        return out
    finally:
        if server is not None:
            server.stop()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workflows", type=int, default=500)
    ap.add_argument("--calls", type=int, default=20, help="calls per workflow")
    ap.add_argument("--address", help="an existing server instead of the embedded one")
    ap.add_argument("--json", type=Path, help="where to write the numbers")
    return ap.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    res = asyncio.run(main(a))
    path = a.json or Path(__file__).parent / "results" / f"audit-{res['when']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    print(f"written to {path}")
