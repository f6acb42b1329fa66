"""Tools for tests/test_metrics.py (prefix ``mt_``), run by ``tests.workflows.Agent``.

Each pays at the real local HTTP bank, or ends in one of the outcomes exactcall counts. The
worker process loads them with ``--tools tests.metrics_app``; ``--plugin
tests.metrics_app:file_tracing`` sets up OpenTelemetry as a user's own module would, writing
every span to the file named by ``EXACTCALL_TEST_SPANS`` (one JSON object a line).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import exactcall
from exactcall.demo.bank_client import payments_with_key, post_payment

SPANS_ENV = "EXACTCALL_TEST_SPANS"
FAST = timedelta(seconds=2)


def _keyed(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post_payment(bank, amount, to, headers=exactcall.idempotency_headers())


@exactcall.tool(heartbeat_timeout=FAST)
def mt_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays; the bank books it under the call's key."""
    return _keyed(bank, amount, to)


@exactcall.tool(heartbeat_timeout=FAST)
def mt_refused(bank: str, amount: int, to: str) -> dict[str, Any]:
    """The bank would refuse it before doing anything: a definite failure, not retried."""
    raise exactcall.NotExecuted(f"account {to} is closed", retry=False)


@exactcall.tool(heartbeat_timeout=FAST)
def mt_lost(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then loses the answer: the outcome is unknown and there is no probe (parked)."""
    _keyed(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


def find_by_key(intent: exactcall.Intent) -> Any:
    """Reconcile probe: the bank's payments under the call's key."""
    rows = payments_with_key(intent.args["bank"], intent.key)
    return exactcall.Landed({"payment_id": rows[0]["id"]}) if rows else exactcall.NotLanded()


@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_by_key)
def mt_lost_probed(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then loses the answer; the probe finds the payment (landed)."""
    _keyed(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
def mt_approved_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Waits for a person's approval of its exact arguments."""
    return _keyed(bank, amount, to)


def file_tracing() -> list[Any]:
    """A ``--plugin`` factory that adds no plugin: it installs a global tracer provider that
    writes each finished span to ``$EXACTCALL_TEST_SPANS``."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_FileExporter(os.environ[SPANS_ENV])))
    trace.set_tracer_provider(provider)
    return []


class _FileExporter:
    """An OpenTelemetry span exporter appending JSON lines (name, ids, parent, attributes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(_row(s)) + "\n" for s in spans]
        with self.lock, open(self.path, "a") as f:
            f.writelines(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _row(span: Any) -> dict[str, Any]:
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": ctx.trace_id,
        "span_id": ctx.span_id,
        "parent_id": span.parent.span_id if span.parent else None,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }
