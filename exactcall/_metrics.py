"""What exactcall counts, through the Temporal runtime's metric meter.

Every metric goes to the meter of the Temporal ``Runtime`` the worker's client connected with,
so it reaches the same Prometheus endpoint or OpenTelemetry collector as Temporal's own
metrics; nothing is recorded when that runtime has no metrics configured. Tool activities use
``activity.metric_meter()``; workflow code uses ``workflow.metric_meter()``, which records
nothing during replay, so a replayed workflow never counts twice. Both meters add Temporal's
own attributes (namespace, task queue, workflow or activity type).

One call is counted once, by the attempt that decides its outcome; a crashed attempt counts
nothing (the attempt after it does), and one that is retried after a definite failure counts
nothing until the last. Pending approvals and parked calls are gauges read from the server
(``exactcall.metrics.report_backlog``): a count kept by workers would be lost with a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from typing import Any, Protocol, TypeVar

from temporalio import activity, workflow
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError

from exactcall._errors import AmbiguousOutcome, IntentConflict, InvalidCall, NotExecuted
from exactcall._errors import ResultNotSerializable as _Unserializable
from exactcall._model import Intent
from exactcall._tracing import call_span
from exactcall.approvals._binding import ApprovalDenied, ApprovalExpired, ApprovalMissing
from exactcall.reconciliation._verdicts import CallAbandoned

__all__ = [
    "APPROVALS_PENDING",
    "APPROVAL_DECISIONS",
    "APPROVAL_REQUESTS",
    "BUDGET_LIMIT",
    "BUDGET_RESERVED",
    "BUDGET_SPENT",
    "CALLS",
    "CALLS_PARKED",
    "DECISION_LATENCY",
    "RECONCILIATIONS",
    "attempt_outcome",
    "count",
    "observed_approval",
    "observed_attempt",
    "reconciliation_parked",
    "reconciliation_verdict",
]

T = TypeVar("T")

CALLS = "exactcall_calls"
"""Counter {tool, outcome}: executed, deduplicated, unknown, conflict, failed, cancelled,
abandoned, refused."""
APPROVAL_REQUESTS = "exactcall_approval_requests"
"""Counter {tool}: calls that started waiting for a person."""
APPROVAL_DECISIONS = "exactcall_approval_decisions"
"""Counter {tool, decision}: approved, denied, expired, cancelled."""
DECISION_LATENCY = "exactcall_approval_decision_latency"
"""Histogram {tool, decision} (approved, denied): request to decision, in workflow time."""
RECONCILIATIONS = "exactcall_reconciliations"
"""Counter {tool, verdict, by}: landed, not_landed, abandoned (by probe or person), and
parked (by probe: it could not tell; by none: the tool has no probe)."""
APPROVALS_PENDING = "exactcall_approvals_pending"
"""Gauge {tool}: calls waiting for approval now (read from the server's visibility)."""
CALLS_PARKED = "exactcall_calls_parked"
"""Gauge {tool}: calls whose outcome is unknown, parked for a person now (visibility)."""

BUDGET_SPENT = "exactcall_budget_spent"
"""Gauge {budget}: a namespace budget's current window, spent (its ledger's memo)."""
BUDGET_RESERVED = "exactcall_budget_reserved"
"""Gauge {budget}: reserved by calls whose outcome is not settled yet."""
BUDGET_LIMIT = "exactcall_budget_limit"
"""Gauge {budget}: its limit (alert on spent / limit)."""

_HELP = {
    CALLS: "exactcall tool calls by outcome",
    APPROVAL_REQUESTS: "exactcall calls that waited for approval",
    APPROVAL_DECISIONS: "exactcall approval requests by how they ended",
    RECONCILIATIONS: "exactcall reconciliation verdicts",
}


def _meter() -> MetricMeter:
    if workflow.in_workflow():
        return workflow.metric_meter()
    if activity.in_activity():
        return activity.metric_meter()
    return MetricMeter.noop


def count(name: str, **attributes: str) -> None:
    """Add one to counter ``name`` with ``attributes``, from workflow or activity code."""
    _meter().create_counter(name, _HELP.get(name)).add(1, attributes)


# -- tool activities --------------------------------------------------------------------------
class Attempt(Protocol):
    """What the outcome metric reads of a tool activity's attempt (``activities._runner``)."""

    @property
    def intent(self) -> Intent: ...
    @property
    def info(self) -> activity.Info: ...
    @property
    def previous_phase(self) -> str | None: ...
    @property
    def deduplicated(self) -> bool: ...


@contextlib.contextmanager
def observed_attempt(attempt: Attempt) -> Iterator[None]:
    """Around one attempt: its span (when OpenTelemetry is in use) and the call's outcome."""
    with call_span(attempt.intent, attempt.info.attempt) as span:
        try:
            yield
        except BaseException as exc:
            outcome = attempt_outcome(attempt, exc)
            if span is not None:
                span.set_attribute("exactcall.outcome", outcome or "retry")
            if outcome is not None:
                count(CALLS, tool=attempt.intent.tool, outcome=outcome)
            raise
        outcome = attempt_outcome(attempt, None) or "executed"
        if span is not None:
            span.set_attribute("exactcall.outcome", outcome)
        count(CALLS, tool=attempt.intent.tool, outcome=outcome)


def attempt_outcome(attempt: Attempt, exc: BaseException | None) -> str | None:
    """The call's outcome decided by this attempt; None when it is not decided (a retry
    follows, or the attempt was cut off)."""
    recorded = getattr(attempt, "deduplicated", False) and attempt.previous_phase != "done"
    if exc is None or isinstance(exc, _Unserializable):  # the effect happened
        return "deduplicated" if recorded else "executed"
    if isinstance(exc, IntentConflict):
        return "conflict"
    if isinstance(exc, AmbiguousOutcome):
        return "unknown"
    if isinstance(exc, CallAbandoned):
        return "abandoned"
    if isinstance(exc, ApprovalMissing | InvalidCall):
        return "refused"
    if isinstance(exc, ApplicationError) and exc.type == NotExecuted.code and exc.non_retryable:
        details = exc.details[0] if exc.details and isinstance(exc.details[0], dict) else {}
        return "cancelled" if details.get("error_type") == "Cancelled" else "failed"
    return None


# -- workflow side ----------------------------------------------------------------------------
async def observed_approval(tool: str, wait: Awaitable[T]) -> T:
    """Around a call's wait for a person: the request, how it ended, and how long it took."""
    start = workflow.now()
    count(APPROVAL_REQUESTS, tool=tool)
    try:
        grant = await wait
    except ApprovalDenied:
        _decided(tool, "denied", start)
        raise
    except ApprovalExpired:
        _decided(tool, "expired", None)
        raise
    except asyncio.CancelledError:
        _decided(tool, "cancelled", None)
        raise
    _decided(tool, "approved", start)
    return grant


def _decided(tool: str, decision: str, start: Any) -> None:
    count(APPROVAL_DECISIONS, tool=tool, decision=decision)
    if start is not None:
        latency = _meter().create_histogram_timedelta(
            DECISION_LATENCY, "from an approval request to its decision", "duration"
        )
        latency.record(workflow.now() - start, {"tool": tool, "decision": decision})


def reconciliation_verdict(tool: str, verdict: str, by: str) -> None:
    """A verdict on an unknown outcome: landed, not_landed or abandon, by the probe or a
    person (whose name is not an attribute: it would make one series per person)."""
    name = "abandoned" if verdict == "abandon" else verdict
    count(RECONCILIATIONS, tool=tool, verdict=name, by="probe" if by == "probe" else "person")


def reconciliation_parked(tool: str, has_probe: bool) -> None:
    """A call parked for a person: its probe could not tell, or it has none."""
    count(RECONCILIATIONS, tool=tool, verdict="parked", by="probe" if has_probe else "none")
