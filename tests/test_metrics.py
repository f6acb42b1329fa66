"""Metrics and traces, read back for real.

A real ``exactcall worker`` process runs with ``--metrics-prometheus``, ``--tracing``, the
backlog gauges every 0.3 s and no workflow cache (every workflow task is a replay, so a metric
recorded again on replay would show); the tests scrape its ``/metrics`` over HTTP after real
calls at the real local bank, and read the spans it wrote. Another worker pushes OTLP/HTTP
metrics to a small collector in the test. Spans are also read from opentelemetry-sdk's
InMemorySpanExporter with Temporal's TracingInterceptor, in process.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import sys
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

import exactcall
from exactcall import approvals, reconciliation
from exactcall.cli._main import _parser
from exactcall.cli._telemetry import client_kwargs
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.testing import WorkerProcess
from tests import budget_app as budget_app
from tests import metrics_app
from tests.conftest import ROOT, plan, running_worker, step
from tests.workflows import Agent

Labels = frozenset[tuple[str, str]]
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, Labels], float]:
    """Every sample of the worker's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


class Metrics:
    """The worker's metrics endpoint: sums of samples by name and a subset of labels."""

    def __init__(self, port: int) -> None:
        self.port = port

    def value(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, ls), v in scrape(self.port).items() if n == name and want <= ls)

    async def until(self, name: str, expected: float, timeout: float = 15, **labels: str) -> None:
        await eventually(lambda: asyncio.to_thread(self.value, name, **labels), expected, timeout)


async def eventually(read: Callable[[], Awaitable[Any]], expected: Any, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await read()) != expected:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"expected {expected!r}, still {got!r} after {timeout}s")
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
async def observed(
    server: DevServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, Metrics, Path]]:
    """A worker process with the metrics and tracing flags: (task queue, metrics, spans file)."""
    tq = f"tq-metrics-{uuid.uuid4().hex[:8]}"
    port = free_port()
    spans = tmp_path_factory.mktemp("spans") / "spans.jsonl"
    wp = WorkerProcess(
        server.address,
        tq,
        tools=["tests.metrics_app"],
        workflows=["tests.workflows:Agent"],
        plugins=["tests.metrics_app:file_tracing"],
        args=[
            *("--metrics-prometheus", f"127.0.0.1:{port}", "--metrics-backlog", "0.3"),
            "--tracing",
            *("--max-cached-workflows", "0"),  # every workflow task replays: counted once?
        ],
        env={metrics_app.SPANS_ENV: str(spans)},
        cwd=ROOT,
        name="metrics",
    )
    try:
        await wp.started()
        yield tq, Metrics(port), spans
    finally:
        wp.stop()


async def run_plan(client: Client, tq: str, p: dict[str, Any], wid: str | None = None) -> Any:
    wid = wid or f"metrics-{uuid.uuid4().hex[:10]}"
    return await client.execute_workflow(Agent.run, p, id=wid, task_queue=tq)


async def test_calls_counted_by_tool_and_outcome(
    client: Client, observed: tuple[str, Metrics, Path], bank: Bank, who: str
) -> None:
    tq, m, _ = observed
    before = {o: m.value("exactcall_calls", tool="mt_pay", outcome=o) for o in _OUTCOMES}
    failed = m.value("exactcall_calls", tool="mt_refused", outcome="failed")
    wid = f"metrics-{uuid.uuid4().hex[:10]}"
    first = await run_plan(client, tq, plan(step("mt_pay", bank.url, 10, who)), wid)
    again = await run_plan(client, tq, plan(step("mt_pay", bank.url, 10, who)), wid)
    other = await run_plan(client, tq, plan(step("mt_pay", bank.url, 11, who)), wid)
    same_key = [step("mt_pay", bank.url, n, who, key="k") for n in (12, 13)]
    racing = await run_plan(client, tq, plan(*same_key, concurrent=True))
    refused = await run_plan(client, tq, plan(step("mt_refused", bank.url, 10, who)))
    assert again[0]["ok"] == first[0]["ok"]
    assert other[0]["error"] == "IntentConflict"
    assert [r.get("error") for r in racing] == [None, "IntentConflict"]  # in the workflow
    assert refused[0]["error"] == "ToolFailed"
    assert bank.count(to=who) == 2  # pay#1 once, and k once
    expected = {"executed": 2, "deduplicated": 1, "conflict": 2, "unknown": 0, "failed": 0}
    for outcome, n in expected.items():
        want = before[outcome] + n
        await m.until("exactcall_calls", want, tool="mt_pay", outcome=outcome)
    await m.until("exactcall_calls", failed + 1, tool="mt_refused", outcome="failed")


_OUTCOMES = ("executed", "deduplicated", "conflict", "unknown", "failed")


async def test_unknown_outcomes_and_reconciliation_verdicts(
    client: Client, observed: tuple[str, Metrics, Path], bank: Bank, who: str
) -> None:
    tq, m, _ = observed
    landed = {"tool": "mt_lost_probed", "verdict": "landed", "by": "probe"}
    parked = {"tool": "mt_lost", "verdict": "parked", "by": "none"}
    abandoned = {"tool": "mt_lost", "verdict": "abandoned", "by": "person"}
    n_landed, n_parked, n_abandoned = (
        m.value("exactcall_reconciliations", **v) for v in (landed, parked, abandoned)
    )
    unknown = m.value("exactcall_calls", tool="mt_lost", outcome="unknown")

    probed = await run_plan(client, tq, plan(step("mt_lost_probed", bank.url, 10, who)))
    assert "payment_id" in probed[0]["ok"]
    await m.until("exactcall_reconciliations", n_landed + 1, **landed)

    wid = f"metrics-{uuid.uuid4().hex[:10]}"
    handle = await client.start_workflow(
        Agent.run, plan(step("mt_lost", bank.url, 10, who)), id=wid, task_queue=tq
    )
    await m.until("exactcall_calls", unknown + 1, tool="mt_lost", outcome="unknown")
    await m.until("exactcall_reconciliations", n_parked + 1, **parked)
    await m.until("exactcall_calls_parked", 1, tool="mt_lost")  # the gauge, from the server
    res = await reconciliation.resolve(client, wid, "mt_lost#1", "abandon", by="ops")
    assert res.accepted
    assert (await handle.result())[0]["error"] == "CallAbandoned"
    await m.until("exactcall_reconciliations", n_abandoned + 1, **abandoned)
    await m.until("exactcall_calls_parked", 0, tool="mt_lost")
    # workflow metrics are not recorded again when a workflow replays (no cache here)
    assert m.value("exactcall_reconciliations", **parked) == n_parked + 1
    assert m.value("exactcall_reconciliations", **landed) == n_landed + 1
    assert bank.count(to=who) == 2  # each lost call paid once; neither was re-sent


async def test_pending_approvals_and_decision_latency(
    client: Client, observed: tuple[str, Metrics, Path], bank: Bank, who: str
) -> None:
    tq, m, _ = observed
    tool = {"tool": "mt_approved_pay"}
    requests = m.value("exactcall_approval_requests", **tool)
    approved = m.value("exactcall_approval_decisions", decision="approved", **tool)
    denied = m.value("exactcall_approval_decisions", decision="denied", **tool)
    latency = "exactcall_approval_decision_latency"
    n_latency = m.value(f"{latency}_count", decision="approved", **tool)
    ms_latency = m.value(f"{latency}_sum", decision="approved", **tool)

    handles = [
        await client.start_workflow(
            Agent.run,
            plan(step("mt_approved_pay", bank.url, n, who)),
            id=f"metrics-{uuid.uuid4().hex[:10]}",
            task_queue=tq,
        )
        for n in (10, 20)
    ]
    await m.until("exactcall_approval_requests", requests + 2, **tool)
    await m.until("exactcall_approvals_pending", 2, **tool)  # the gauge, from the server
    await asyncio.sleep(1.0)  # a person takes a while
    reqs = [await _pending(client, h.id) for h in handles]
    await approvals.approve(
        client, handles[0].id, reqs[0].step, args_hash=reqs[0].args_hash, by="ops"
    )
    await m.until("exactcall_approvals_pending", 1, **tool)
    await approvals.deny(client, handles[1].id, reqs[1].step, args_hash=reqs[1].args_hash, by="ops")
    await m.until("exactcall_approvals_pending", 0, **tool)
    assert "ok" in (await handles[0].result())[0]
    assert (await handles[1].result())[0]["error"] == "ApprovalDenied"
    await m.until("exactcall_approval_decisions", approved + 1, decision="approved", **tool)
    await m.until("exactcall_approval_decisions", denied + 1, decision="denied", **tool)
    await m.until(f"{latency}_count", n_latency + 1, decision="approved", **tool)
    assert m.value(f"{latency}_sum", decision="approved", **tool) - ms_latency >= 1000
    assert m.value("exactcall_approval_requests", **tool) == requests + 2  # not on replay
    assert bank.count(to=who) == 1


async def test_budget_gauges_from_the_ledger(
    client: Client, observed: tuple[str, Metrics, Path], bank: Bank, who: str
) -> None:
    # the calls run on a worker of their own: the metrics worker has no workflow cache, and
    # a budgeted call's local activity needs one (such a worker is refused, see test_budgets)
    _, m, _ = observed
    tq = f"tq-budget-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, tq):
        for amount in (10, 20):
            out = await run_plan(client, tq, plan(step("mt_budgeted_pay", bank.url, amount, who)))
            assert "ok" in out[0], out
    budget = {"budget": "mt-refunds"}
    await m.until("exactcall_budget_spent", 30, **budget)  # read from the ledger's memo
    await m.until("exactcall_budget_reserved", 0, **budget)
    await m.until("exactcall_budget_limit", 1000, **budget)
    assert bank.count(to=who) == 2


async def _pending(client: Client, wid: str) -> approvals.ApprovalRequest:
    for _ in range(100):
        view = await approvals.view(client, wid)
        if view.pending:
            return view.pending[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{wid} has no pending call")


async def test_worker_tracing_flag_gives_a_span_per_call(
    client: Client, observed: tuple[str, Metrics, Path], bank: Bank, who: str
) -> None:
    tq, _, spans_file = observed
    wid = f"metrics-{uuid.uuid4().hex[:10]}"
    await run_plan(client, tq, plan(step("mt_pay", bank.url, 10, who)), wid)
    await run_plan(client, tq, plan(step("mt_pay", bank.url, 10, who)), wid)

    def mine() -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in spans_file.read_text().splitlines()]
        return [r for r in rows if r["attributes"].get("exactcall.workflow_id") == wid]

    await eventually(lambda: asyncio.to_thread(lambda: len(mine())), 2, 10)
    calls = mine()
    outcomes = [c["attributes"]["exactcall.outcome"] for c in calls]
    assert sorted(outcomes) == ["deduplicated", "executed"]
    key = exactcall.derive_key("default", wid, "mt_pay#1", "mt_pay", "1")
    for c in calls:
        assert c["name"] == "exactcall.call:mt_pay"
        assert c["attributes"]["exactcall.step"] == "mt_pay#1"
        assert c["attributes"]["exactcall.key"] == key
    rows = [json.loads(line) for line in spans_file.read_text().splitlines()]
    parents = {r["span_id"]: r["name"] for r in rows}
    assert {parents.get(c["parent_id"]) for c in calls} == {"RunActivity:mt_pay"}


@pytest.fixture(scope="module")
def memory_spans() -> Iterator[Any]:
    """opentelemetry-sdk's InMemorySpanExporter on the global tracer provider."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # later spans of the session are dropped, not kept


async def test_tracing_interceptor_span_per_call_in_memory(
    server: DevServer, memory_spans: Any, bank: Bank, who: str
) -> None:
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from exactcall._worker import Connection, build_worker, connect

    traced = await connect(
        Connection(address=server.address, namespace="default"),
        exactcall.Plugin(tools=[metrics_app.mt_pay]),
        interceptors=[TracingInterceptor()],
    )
    tq = f"tq-traced-{uuid.uuid4().hex[:8]}"
    wid = f"traced-{uuid.uuid4().hex[:10]}"
    async with build_worker(traced, tq, [Agent]):
        for amount in (10, 10, 11):  # executed, then deduplicated, then a conflict
            await traced.execute_workflow(
                Agent.run, plan(step("mt_pay", bank.url, amount, who)), id=wid, task_queue=tq
            )
    spans = [s for s in memory_spans.get_finished_spans() if _attr(s, "workflow_id") == wid]
    assert [_attr(s, "outcome") for s in spans] == ["executed", "deduplicated", "conflict"]
    for s, amount in zip(spans, (10, 10, 11), strict=True):
        assert s.name == "exactcall.call:mt_pay"
        assert _attr(s, "tool") == "mt_pay"
        assert _attr(s, "step") == "mt_pay#1"
        assert _attr(s, "key") == exactcall.derive_key("default", wid, "mt_pay#1", "mt_pay", "1")
        assert _attr(s, "args_hash") == exactcall.intent_hash("mt_pay", bank.url, amount, who)
    assert spans[2].status.status_code.name == "ERROR"
    by_id = {s.context.span_id: s for s in memory_spans.get_finished_spans()}
    for s in spans:
        parent = by_id[s.parent.span_id]
        assert parent.name == "RunActivity:mt_pay"
        assert parent.context.trace_id == s.context.trace_id
    starts = [s for s in by_id.values() if s.name == "StartWorkflow:Agent"]
    assert {s.context.trace_id for s in spans} <= {s.context.trace_id for s in starts}
    assert bank.count(to=who) == 1


def _attr(span: Any, name: str) -> Any:
    return (span.attributes or {}).get(f"exactcall.{name}")


class _Collector(ThreadingHTTPServer):
    """Receives OTLP/HTTP metric exports and keeps their (protobuf) bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _CollectorHandler)


class _CollectorHandler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/metrics":
            self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_worker_pushes_metrics_to_an_otlp_collector(
    server: DevServer, client: Client, bank: Bank, who: str
) -> None:
    collector = _Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{collector.server_address[1]}/v1/metrics"
    tq = f"tq-otlp-{uuid.uuid4().hex[:8]}"
    wp = WorkerProcess(
        server.address,
        tq,
        tools=["tests.metrics_app"],
        workflows=["tests.workflows:Agent"],
        args=["--metrics-otel", url, "--metrics-backlog", "0"],
        cwd=ROOT,
        name="otlp",
    )
    try:
        await wp.started()
        await run_plan(client, tq, plan(step("mt_pay", bank.url, 10, who)))

        def exported() -> bool:
            return any(b"exactcall_calls" in b and b"executed" in b for b in collector.bodies)

        await eventually(lambda: asyncio.to_thread(exported), True, 15)
    finally:
        wp.stop()
        collector.shutdown()
        collector.server_close()
    assert bank.count(to=who) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-prometheus", "9464"], "expected HOST:PORT"),
        (["--metrics-otel", "localhost:4317"], "expected a URL"),
        (["--metrics-prometheus", "a:1", "--metrics-otel", "http://c"], "not both"),
        (["--metrics-otel-header", "x=y"], "goes with --metrics-otel"),
        (["--metrics-prometheus", "127.0.0.1:1", "--metrics-backlog", "-1"], "give 0"),
    ],
)
def test_metrics_flags_refuse_bad_values(flags: list[str], message: str) -> None:
    ns = _parser().parse_args(["worker", "--task-queue", "q", *flags])
    with pytest.raises(ValueError, match=message):
        client_kwargs(ns)


async def test_worker_with_a_busy_metrics_port_exits_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "exactcall",
            "worker",
            "--task-queue",
            "q",
            "--tools",
            "tests.metrics_app",
            "--metrics-prometheus",
            f"127.0.0.1:{port}",
            "--address",
            "127.0.0.1:1",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    assert b"Address already in use" in err
