"""``exactcall worker`` flags for metrics and traces, and what they build.

``--metrics-prometheus HOST:PORT`` / ``--metrics-otel URL`` give the client a Temporal
``Runtime`` that exports Temporal's metrics and exactcall's (``exactcall.metrics``);
``--metrics-backlog SECONDS`` sets how often the worker reads the pending-approval and parked
gauges from the server (0: never). ``--tracing`` adds ``temporalio.contrib.opentelemetry``'s
``TracingInterceptor`` (spans go to the global OpenTelemetry tracer provider).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

__all__ = ["add_args", "backlog_reporting", "client_kwargs"]

DEFAULT_BACKLOG_SECONDS = 30.0


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("metrics and traces (Temporal's own and exactcall's)")
    g.add_argument(
        "--metrics-prometheus",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics",
    )
    g.add_argument(
        "--metrics-otel",
        metavar="URL",
        help="push metrics to an OpenTelemetry collector (OTLP gRPC, e.g. "
        "http://localhost:4317; OTLP HTTP when the URL ends with /v1/metrics)",
    )
    g.add_argument(
        "--metrics-otel-header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header for the collector (authentication); repeatable",
    )
    g.add_argument(
        "--metrics-backlog",
        type=float,
        default=DEFAULT_BACKLOG_SECONDS,
        metavar="SECONDS",
        help="how often to read the exactcall_approvals_pending and exactcall_calls_parked "
        f"gauges from the server (default {DEFAULT_BACKLOG_SECONDS:g}; 0: never)",
    )
    g.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry spans for workflows, activities and every exactcall call, through "
        "temporalio.contrib.opentelemetry's TracingInterceptor and the global tracer provider "
        "(needs exactcall[otel])",
    )


def client_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """``runtime=`` and ``interceptors=`` for ``Client.connect``; ValueError/ImportError with
    a message for the user when a flag cannot be honoured."""
    kw: dict[str, Any] = {}
    if ns.metrics_prometheus and ns.metrics_otel:
        raise ValueError("give one of --metrics-prometheus and --metrics-otel, not both")
    if ns.metrics_otel_header and not ns.metrics_otel:
        raise ValueError("--metrics-otel-header goes with --metrics-otel")
    if ns.metrics_backlog < 0:
        raise ValueError(f"--metrics-backlog {ns.metrics_backlog:g}: give 0 (never) or more")
    if ns.metrics_prometheus or ns.metrics_otel:
        from exactcall.metrics import telemetry_runtime

        kw["runtime"] = telemetry_runtime(
            prometheus=ns.metrics_prometheus,
            otel=ns.metrics_otel,
            otel_headers=_headers(ns.metrics_otel_header),
        )
    if ns.tracing:
        try:
            from temporalio.contrib.opentelemetry import TracingInterceptor
        except ImportError as exc:
            raise ImportError(
                f"--tracing needs OpenTelemetry ({exc}): pip install 'exactcall[otel]'"
            ) from exc
        kw["interceptors"] = [TracingInterceptor()]
    return kw


def _headers(options: list[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for opt in options:
        name, sep, value = opt.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--metrics-otel-header {opt!r}: expected NAME=VALUE")
        out[name.strip()] = value
    return out or None


@contextlib.asynccontextmanager
async def backlog_reporting(ns: argparse.Namespace, client: Any) -> AsyncIterator[None]:
    """The backlog gauges while the worker runs, when metrics are on."""
    if not (ns.metrics_prometheus or ns.metrics_otel) or ns.metrics_backlog == 0:
        yield
        return
    from exactcall.metrics import report_backlog

    async with report_backlog(client, timedelta(seconds=ns.metrics_backlog)):
        yield
