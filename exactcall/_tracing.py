"""A span per attempt of an exactcall call, when the process uses OpenTelemetry.

exactcall does not import OpenTelemetry: when ``opentelemetry.trace`` is already imported (by
``temporalio.contrib.opentelemetry``'s ``TracingInterceptor`` or ``OpenTelemetryPlugin``, or by
your own setup), each attempt of a tool activity runs in a span ``exactcall.call:<tool>`` from
the global tracer provider. Under Temporal's interceptor it is a child of the activity's
``RunActivity:<tool>`` span, in the trace of the workflow that made the call. Its attributes:
``exactcall.tool``, ``exactcall.step``, ``exactcall.key``, ``exactcall.args_hash``,
``exactcall.workflow_id``, ``exactcall.attempt`` and, when the attempt ends,
``exactcall.outcome`` (the outcome of ``exactcall_calls``, or ``retry`` when another attempt
follows).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from exactcall._model import Intent

__all__ = ["SPAN_PREFIX", "TRACER_NAME", "call_span"]

TRACER_NAME = "exactcall"
SPAN_PREFIX = "exactcall.call:"


@contextlib.contextmanager
def call_span(intent: Intent, attempt: int) -> Iterator[Any]:
    """The span of one attempt (None when OpenTelemetry is not in use)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        yield None
        return
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "exactcall.tool": intent.tool,
        "exactcall.step": intent.step,
        "exactcall.key": intent.key,
        "exactcall.args_hash": intent.args_hash,
        "exactcall.workflow_id": intent.workflow_id,
        "exactcall.attempt": attempt,
    }
    with tracer.start_as_current_span(SPAN_PREFIX + intent.tool, attributes=attributes) as span:
        yield span
