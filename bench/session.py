"""What an ``exactcall.session`` call costs, against the same payment made directly and as a
bare Temporal workflow per call.

    python bench/session.py             # 40 payments per mode (~1 min)
    python bench/session.py --n 100 --block 10

One dev server (``DevServer(fast=True)``), one real local bank (``exactcall.demo.bank``), one
process, one run. Three ways to make the same payment (``POST /payments`` at the bank):

* **direct**: the function, called from the process (no Temporal);
* **bare**: what a session does without exactcall: a workflow per call (``BarePayment``, id
  per call), its one plain activity run by a worker in this process, started and awaited;
* **session**: ``await s.call(bench_pay, ...)`` in an open ``exactcall.session`` (its call
  workflow, the tool as an exactcall activity, the run claim; provider-idempotent, so no
  pre-call heartbeat).

After a warm-up, ``--n`` sequential payments per mode with distinct amounts, interleaved in
ABBA-style blocks of ``--block``. Printed: p50, p95, mean per mode, and the ratios session/bare
and session/direct of the p50s; then the payments counted at the bank (each exactly once).
Nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import exactcall  # noqa: E402
from exactcall._worker import Connection, build_worker, connect  # noqa: E402
from exactcall.demo.bank import Bank  # noqa: E402
from exactcall.demo.bank_client import post_payment  # noqa: E402
from exactcall.embedded._server import DevServer  # noqa: E402


@exactcall.tool(provider_idempotent=True)
def bench_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post_payment(bank, amount, to, exactcall.idempotency_headers())


@activity.defn(name="bench_bare_pay")
def bare_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post_payment(bank, amount, to)


@workflow.defn(name="BarePayment", sandboxed=False)
class BarePayment:
    @workflow.run
    async def run(self, bank: str, amount: int, to: str) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            "bench_bare_pay", args=[bank, amount, to], start_to_close_timeout=timedelta(seconds=30)
        )
        return result


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50_ms": statistics.median(xs) * 1000,
        "p95_ms": xs[int(len(xs) * 0.95) - 1] * 1000,
        "mean_ms": statistics.fmean(xs) * 1000,
    }


async def measure(
    client: Any, bank: Bank, n: int, block: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    tq = f"bench-bare-{uuid.uuid4().hex[:8]}"
    who = {m: f"{m}-{uuid.uuid4().hex[:6]}" for m in ("direct", "bare", "session")}
    times: dict[str, list[float]] = {m: [] for m in who}
    worker = build_worker(client, tq, [BarePayment], activities=[bare_pay])
    session = exactcall.session(f"bench-{uuid.uuid4().hex[:8]}", client=client)
    async with worker, session as s:

        async def one(mode: str, amount: int) -> None:
            t0 = time.perf_counter()
            if mode == "direct":
                await asyncio.to_thread(post_payment, bank.url, amount, who[mode])
            elif mode == "bare":
                await client.execute_workflow(
                    BarePayment.run,
                    args=[bank.url, amount, who[mode]],
                    id=f"bare-{uuid.uuid4().hex}",
                    task_queue=tq,
                )
            else:
                await s.call(bench_pay, bank.url, amount, who[mode])
            times[mode].append(time.perf_counter() - t0)

        for mode in who:  # warm-up
            await one(mode, 1)
            times[mode].clear()
        order = list(who)
        amount = 2
        for b in range(max(1, n // block)):
            for mode in order if b % 2 == 0 else reversed(order):
                for _ in range(block):
                    await one(mode, amount)
                    amount += 1
    return times, {m: bank.count(a) for m, a in who.items()}


async def main(n: int, block: int, out: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, DevServer(fast=True) as srv:
        client = await connect(Connection(address=srv.address, namespace="default"))
        with Bank(Path(tmp) / "bank.db") as bank:
            times, counts = await measure(client, bank, n, block)
    report = {m: stats(t) for m, t in times.items()}
    p50 = {m: r["p50_ms"] for m, r in report.items()}
    ratios = {
        "session/bare": p50["session"] / p50["bare"],
        "session/direct": p50["session"] / p50["direct"],
        "session-bare_ms": p50["session"] - p50["bare"],
    }
    print(f"{'mode':8} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}  payments at the bank")
    for m, r in report.items():
        print(f"{m:8} {r['p50_ms']:8.1f} {r['p95_ms']:8.1f} {r['mean_ms']:8.1f}  {counts[m]}")
    print(
        f"session/bare {ratios['session/bare']:.2f}x (+{ratios['session-bare_ms']:.1f} ms), "
        f"session/direct {ratios['session/direct']:.1f}x"
    )
    if out:
        Path(out).write_text(json.dumps({"report": report, "ratios": ratios, "counts": counts}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    asyncio.run(main(a.n, a.block, a.json))
