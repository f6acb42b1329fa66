"""exactcall's metrics: names, a Temporal runtime that exports them, and the backlog gauges.

exactcall records its metrics on the metric meter of the Temporal ``Runtime`` your client
connected with, next to Temporal's own (``exactcall worker --metrics-prometheus HOST:PORT`` or
``--metrics-otel URL`` builds that runtime for you):

    exactcall_calls{tool, outcome}                counter: executed, deduplicated, unknown,
                                                  conflict, failed, cancelled, abandoned, refused
    exactcall_approval_requests{tool}             counter: calls that waited for a person
    exactcall_approval_decisions{tool, decision}  counter: approved, denied, expired, cancelled
    exactcall_approval_decision_latency{tool, decision}
                                                  histogram: request to decision (approved,
                                                  denied), in milliseconds of workflow time
    exactcall_reconciliations{tool, verdict, by}  counter: landed / not_landed / abandoned by
                                                  probe or person; parked by probe or none
    exactcall_approvals_pending{tool}             gauge: calls waiting for approval now
    exactcall_calls_parked{tool}                  gauge: unknown outcomes parked for a person now
    exactcall_budget_spent{budget}                gauge: a namespace budget's current window:
    exactcall_budget_reserved{budget}                    spent, reserved (calls not settled
    exactcall_budget_limit{budget}                       yet, pending approvals too), limit

The gauges are read from the server (the ``ExactcallPending`` / ``ExactcallUnresolved``
search attributes and the workflows' memos, and each budget ledger's memo) by
:func:`report_backlog`, which
``exactcall worker`` runs when metrics are on; every worker that runs it reports the same
cluster-wide numbers (take ``max`` across workers, not ``sum``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta

import structlog
from temporalio.client import Client
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

from exactcall._metrics import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTS,
    APPROVALS_PENDING,
    BUDGET_LIMIT,
    BUDGET_RESERVED,
    BUDGET_SPENT,
    CALLS,
    CALLS_PARKED,
    DECISION_LATENCY,
    RECONCILIATIONS,
)

__all__ = [
    "APPROVALS_PENDING",
    "APPROVAL_DECISIONS",
    "APPROVAL_REQUESTS",
    "CALLS",
    "CALLS_PARKED",
    "DECISION_LATENCY",
    "DECISION_LATENCY_BUCKETS_MS",
    "RECONCILIATIONS",
    "backlog",
    "report_backlog",
    "telemetry_runtime",
]

log = structlog.get_logger("exactcall")

DECISION_LATENCY_BUCKETS_MS = tuple(
    float(s * 1000) for s in (1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
)
"""Buckets of the decision latency (1 s to a day): Temporal's default duration buckets end at
10 s, which a person rarely beats."""
_BUCKETS = {DECISION_LATENCY: DECISION_LATENCY_BUCKETS_MS}


def telemetry_runtime(
    *,
    prometheus: str | None = None,
    otel: str | None = None,
    otel_headers: Mapping[str, str] | None = None,
    global_tags: Mapping[str, str] | None = None,
) -> Runtime:
    """A Temporal ``Runtime`` exporting Temporal's and exactcall's metrics.

    ``prometheus``: ``HOST:PORT`` to serve ``/metrics`` on; ``otel``: an OTLP collector URL
    (gRPC, e.g. ``http://localhost:4317``, or HTTP when it ends with ``/v1/metrics``). Exactly
    one of them. Pass the runtime to ``Client.connect(..., runtime=...)``."""
    if (prometheus is None) == (otel is None):
        raise ValueError("give exactly one of prometheus='HOST:PORT' or otel='URL'")
    metrics = _prometheus(prometheus) if prometheus is not None else _otel(otel, otel_headers)
    return Runtime(telemetry=TelemetryConfig(metrics=metrics, global_tags=global_tags or {}))


def _prometheus(address: str) -> PrometheusConfig:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"prometheus={address!r}: expected HOST:PORT, e.g. 0.0.0.0:9464")
    return PrometheusConfig(bind_address=address, histogram_bucket_overrides=_BUCKETS)


def _otel(url: str | None, headers: Mapping[str, str] | None) -> OpenTelemetryConfig:
    if not url or not url.startswith(("http://", "https://")):
        raise ValueError(f"otel={url!r}: expected a URL, e.g. http://localhost:4317")
    return OpenTelemetryConfig(
        url=url,
        headers=headers,
        http=url.rstrip("/").endswith("/v1/metrics"),
        histogram_bucket_overrides=_BUCKETS,
    )


async def backlog(client: Client) -> tuple[dict[str, int], dict[str, int]]:
    """(calls waiting for approval, parked calls), each by tool, as the server lists them."""
    from exactcall.approvals import list_pending
    from exactcall.reconciliation import list_unresolved

    pending: dict[str, int] = {}
    for req in await list_pending(client):
        pending[req.tool] = pending.get(req.tool, 0) + 1
    parked: dict[str, int] = {}
    for row in await list_unresolved(client):
        parked[row.tool] = parked.get(row.tool, 0) + 1
    return pending, parked


async def budget_figures(client: Client) -> dict[str, tuple[float, float, float]]:
    """Each namespace budget's latest window: (spent, reserved, limit), from its ledger's memo.
    Workflow-scope budgets are left out (a series per workflow id would not stay bounded)."""
    from exactcall.budgets._budget import ledgers

    out: dict[str, tuple[float, float, float]] = {}
    async for _, v in ledgers(client):
        if v.scope == "namespace" and v.windows:
            w = max(v.windows, key=lambda w: w.window)
            out[v.budget] = (w.spent, w.reserved, w.limit)
    return out


@contextlib.asynccontextmanager
async def report_backlog(
    client: Client, every: timedelta = timedelta(seconds=30)
) -> AsyncIterator[None]:
    """While the block runs, set the gauges ``exactcall_approvals_pending`` and
    ``exactcall_calls_parked`` every ``every``, on the client's runtime's meter. A tool whose
    calls all left the backlog is reported as 0."""
    task = asyncio.create_task(_report(client, every.total_seconds()))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _report(client: Client, every: float) -> None:
    runtime = client.service_client.config.runtime or Runtime.default()
    meter = runtime.metric_meter
    gauges = {
        APPROVALS_PENDING: meter.create_gauge(APPROVALS_PENDING, "calls waiting for approval"),
        CALLS_PARKED: meter.create_gauge(CALLS_PARKED, "unknown outcomes parked for a person"),
    }
    budget_gauges = (
        meter.create_gauge_float(BUDGET_SPENT, "a namespace budget's current window: spent"),
        meter.create_gauge_float(BUDGET_RESERVED, "... reserved, not settled yet"),
        meter.create_gauge_float(BUDGET_LIMIT, "... its limit"),
    )
    seen: dict[str, set[str]] = {APPROVALS_PENDING: set(), CALLS_PARKED: set()}
    failing = False
    while True:
        try:
            pending, parked = await backlog(client)
            budgets = await budget_figures(client)
        except Exception as exc:  # the server is away or lacks the search attributes
            if not failing:
                log.warning("metrics.backlog_unavailable", error=f"{type(exc).__name__}: {exc}")
            failing = True
        else:
            failing = False
            for name, by_tool in ((APPROVALS_PENDING, pending), (CALLS_PARKED, parked)):
                seen[name] |= set(by_tool)
                for tool in seen[name]:
                    gauges[name].set(by_tool.get(tool, 0), {"tool": tool})
            for budget, figures in budgets.items():
                for gauge, value in zip(budget_gauges, figures, strict=True):
                    gauge.set(value, {"budget": budget})
        await asyncio.sleep(every)
