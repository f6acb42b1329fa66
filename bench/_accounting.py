"""Phase 5 of ``bench/overhead.py``: what one call costs the server, counted, not timed.

* **requests per call**: the dev server's own ``service_requests`` counter (Prometheus,
  ``--metrics-port``) of its frontend in the bench's namespace (the history service counts
  each request again), by operation, before and after ``n`` one-call workflows per mode run
  one after the other; the factor is checked, not assumed: bare's ``StartWorkflowExecution``
  count per workflow (1). This phase's own ``CountWorkflowExecutions`` and
  ``DescribeWorkflowExecution`` are left out.
  Whatever a record causes after the call is counted too (it runs no workflow task, and the
  server closes it, timed out, 5 minutes after its claim): during this phase records live
  1 s, and the count is taken once every record has closed.
* **history bytes per call**: ``history_size_bytes`` of one finished workflow per mode, plus,
  for exactcall, its call record's (once closed).
* **charged throughput**: on this CPU-bound machine, calls/s follow the CPU a call costs, so
  the steady-state ratio is bare's CPU per call over exactcall's (this process: client and
  worker; plus the dev server), measured over ``m`` one-call workflows at once per mode and
  a window that ends 2.5 s after the last result, in which the records close
  (``records_open_at_end`` says if any had not).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client

from exactcall._canonical import derive_key
from exactcall.activities import _records, _runs
from exactcall.workflows import RECORD_WORKFLOW, record_id

_LINE = re.compile(r"^service_requests\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
BENCH_OWN = {"CountWorkflowExecutions", "DescribeWorkflowExecution"}
"""Requests this phase makes itself to watch the records close, not caused by the calls."""
WORKER_OWN = {"PollWorkflowTaskQueue", "PollActivityTaskQueue", "RecordWorkerHeartbeat"}
REPORT_DELAY_S = 1.5
"""The server reports its counters every second: wait that out before each reading."""
RECORD_DELAY = timedelta(seconds=1)
"""The records' lifetime while this phase and the profile run, so that they close in the
window measured (the package's is ``_records.RECORD_LIFETIME``, 5 minutes)."""


@contextlib.contextmanager
def records_living(lifetime: timedelta) -> Iterator[None]:
    """Records claimed inside close by themselves after ``lifetime``."""
    saved = _records.RECORD_LIFETIME, _runs.CLAIM_LIFETIME
    _records.RECORD_LIFETIME = _runs.CLAIM_LIFETIME = lifetime
    try:
        yield
    finally:
        _records.RECORD_LIFETIME, _runs.CLAIM_LIFETIME = saved


def scrape(url: str, namespace: str) -> dict[str, float]:
    """``service_requests`` to the frontend in ``namespace``, by operation (what clients and
    workers sent; the history service counts them again)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        op = labels.get("operation", "?")
        frontend = labels.get("service_name") == "frontend"
        if frontend and labels.get("namespace") == namespace and op not in BENCH_OWN:
            out[op] += float(m.group("value"))
    return dict(out)


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


async def records_open(client: Client, task_queue: str, since: datetime) -> int:
    """Records claimed since ``since`` still open (earlier phases' wait out 5 minutes)."""
    types = f"WorkflowType IN ('{RECORD_WORKFLOW}', '{_runs.RUN_CLAIM_WORKFLOW}')"
    q = (
        f"{types} AND TaskQueue = '{task_queue}' "
        f"AND ExecutionStatus = 'Running' AND StartTime >= '{since.isoformat()}'"
    )
    return (await client.count_workflows(q)).count


async def until_records_closed(
    client: Client, task_queue: str, since: datetime, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    await asyncio.sleep(RECORD_DELAY.total_seconds() + 0.5)
    while await records_open(client, task_queue, since) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)  # the record's last task completion reaches the counter


async def history_bytes(client: Client, workflow_id: str) -> int:
    desc = await client.get_workflow_handle(workflow_id).describe()
    return int(desc.raw_description.workflow_execution_info.history_size_bytes)


async def written_bytes(client: Client, workflow_id: str, keys: list[str]) -> int:
    """History bytes of what exactcall wrote besides the calling workflow: the workflow id's
    run claim and every per-call record (a run that holds its claim writes none)."""
    total = 0
    for wid in (_runs.run_claim_id(workflow_id), *(record_id(k) for k in keys)):
        with contextlib.suppress(Exception):  # not there: nothing written
            total += await history_bytes(client, wid)
    return total


async def account_run(bench: Any, metrics_url: str | None, k: int) -> dict[str, Any]:
    """Requests and history bytes per call in one workflow making ``k`` calls, per mode."""
    client: Client = bench.client
    tq, ns = bench.task_queue, bench.client.namespace
    out: dict[str, Any] = {"k": k}
    with records_living(RECORD_DELAY):
        for mode in ("bare", "exactcall"):
            await asyncio.sleep(REPORT_DELAY_S)
            before_req = scrape(metrics_url, ns) if metrics_url else None
            since = datetime.now(UTC)
            await bench.run_one(mode, k)
            wid = bench.last_id
            if mode == "exactcall":
                await until_records_closed(client, tq, since)
            row: dict[str, Any] = {"history_bytes": await history_bytes(client, wid)}
            if mode == "exactcall":
                t = bench.tool
                keys = [derive_key(ns, wid, f"{t}#{i}", t, "1") for i in range(1, k + 1)]
                row["written_bytes"] = await written_bytes(client, wid, keys)
            if before_req is not None and metrics_url:
                await asyncio.sleep(REPORT_DELAY_S)
                row["requests"] = diff(scrape(metrics_url, ns), before_req)
            out[mode] = row
    bare, ec = out["bare"], out["exactcall"]
    out["history_bytes_ratio"] = (ec["history_bytes"] + ec["written_bytes"]) / bare["history_bytes"]
    if "requests" in bare and "requests" in ec:
        factor = bare["requests"].get("StartWorkflowExecution", 0)  # one workflow per mode
        if factor:
            out.update(extra_requests(bare["requests"], ec["requests"], k * factor, 3))
    return out


def extra_requests(
    bare: dict[str, float], ec: dict[str, float], per: float, digits: int
) -> dict[str, Any]:
    """exactcall's requests beyond bare's, by operation and in all, divided by ``per``."""
    per_call = {op: (ec.get(op, 0) - bare.get(op, 0)) / per for op in sorted(set(ec) | set(bare))}
    # polls are a worker asking for work (one per task it gets, plus idle re-polls); worker
    # heartbeats are per worker and second: neither is a request of the call's
    caused = {k: v for k, v in per_call.items() if k not in WORKER_OWN}
    return {
        "extra_requests_by_operation": {
            op: round(v, digits) for op, v in per_call.items() if abs(v) >= 5 * 10**-digits
        },
        "extra_requests_per_call": round(sum(caused.values()), digits),
        "extra_requests_with_polls": round(sum(per_call.values()), digits),
    }


async def account(bench: Any, metrics_url: str | None, n: int, m: int) -> dict[str, Any]:
    """Requests and history bytes per call (``n`` sequential one-call workflows per mode),
    and CPU per call with the records' closing counted (``m`` at once per mode)."""
    client: Client = bench.client
    tq = bench.task_queue
    out: dict[str, Any] = {"n": n, "m": m, "record_delay_s": RECORD_DELAY.total_seconds()}
    ns = client.namespace
    with records_living(RECORD_DELAY):  # the records close (by themselves) in the window
        for mode in ("bare", "exactcall"):
            await asyncio.sleep(REPORT_DELAY_S)
            before_req = scrape(metrics_url, ns) if metrics_url else None
            since = datetime.now(UTC)
            for _ in range(n):
                await bench.run_one(mode, 1)
            last_id = bench.last_id
            if mode == "exactcall":
                await until_records_closed(client, tq, since)
            row: dict[str, Any] = {"history_bytes": await history_bytes(client, last_id)}
            if mode == "exactcall":
                key = derive_key(ns, last_id, f"{bench.tool}#1", bench.tool, "1")
                row["record_history_bytes"] = await written_bytes(client, last_id, [key])
            if before_req is not None and metrics_url:
                await asyncio.sleep(REPORT_DELAY_S)
                row["requests"] = diff(scrape(metrics_url, ns), before_req)
            out[mode] = row
        await bench.meter.calibrate()  # the idle rates now, after phases 1-4
        settle = RECORD_DELAY.total_seconds() + 1.5
        for mode in ("bare", "exactcall"):
            before, since = bench.meter.snap(), datetime.now(UTC)
            await asyncio.gather(*(bench.run_one(mode, 1) for _ in range(m)))
            await asyncio.sleep(settle)  # the same window for both: the records run in it
            left = await records_open(client, tq, since) if mode == "exactcall" else 0
            out[mode]["cpu"] = bench.meter.per_op_ms(before, bench.meter.snap(), m)
            out[mode]["records_open_at_end"] = left
            if mode == "exactcall":
                await until_records_closed(client, tq, since)
    return with_ratios(out)


def with_ratios(out: dict[str, Any]) -> dict[str, Any]:
    n = out["n"]
    bare, ec = out["bare"], out["exactcall"]
    ec_bytes = ec["history_bytes"] + ec.get("record_history_bytes", 0)
    out["history_bytes_ratio"] = ec_bytes / bare["history_bytes"]

    def total_cpu(row: dict[str, Any]) -> float:
        c = row["cpu"]
        return c["cpu_ms_per_call_process"] + c.get("cpu_ms_per_call_server", 0.0)

    out["throughput_charged_ratio"] = total_cpu(bare) / total_cpu(ec)
    if "requests" in bare and "requests" in ec:
        factor = bare["requests"].get("StartWorkflowExecution", 0) / n
        out["metric_counts_each_request"] = factor
        if factor:
            out.update(extra_requests(bare["requests"], ec["requests"], n * factor, 2))
    return out
