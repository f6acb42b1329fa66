"""The one reader of a workflow history: what exactcall's calls did, event by event.

Every reader of a run's calls starts here: the audit and the recorded tools
(``_calls.calls_in_history``), replay and diff (``_replay.recorded_intents``), and an
attempt's slow path (``activities/_runs``). A call is a scheduled activity whose input decodes
as an intent (either form: ``WireIntent`` or a full ``Intent``); an activity whose input does
not is a plain Temporal activity, unless it looks like a call (its type is a tool's or
exactcall's, or its input has an intent's fields): then it is a *problem*, never hidden.
Whether a call was a read is in its activity's header (``READ_HEADER``), in histories
recorded since it is written; ``read`` is None in older ones.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from exactcall._model import Intent, intent_from_input
from exactcall._wire import AWAIT_SETTLED, MCP_PROXY_AWAIT_SETTLED, READ_HEADER

__all__ = ["HistoryCall", "RunHistory", "read_history"]

_ET = EventType
_WAITS = frozenset({AWAIT_SETTLED, MCP_PROXY_AWAIT_SETTLED})
_INTENT_FIELDS = frozenset({"args_hash", "key", "tool", "step", "tool_version", "workflow_id"})


@dataclass
class HistoryCall:
    """One scheduled activity of a call, and how it went."""

    event_id: int
    intent: Intent
    activity_id: str
    activity_type: str
    scheduled_at: datetime
    min_timeout: timedelta
    """The shorter of its heartbeat and start-to-close timeouts (zero: neither set)."""
    read: bool | None
    """Scheduled as a read (its header says); None in histories from before the header."""
    attempts: int = 0
    started: bool = False
    closed: str | None = None
    """``completed``, ``failed``, ``timed_out`` or ``canceled``; None while it runs."""
    closed_at: datetime | None = None
    result: Payload | None = None
    failure_type: str | None = None
    """An application failure's type, as recorded (failed only)."""
    error_type: str | None = None
    error: str | None = None
    error_details: tuple[Any, ...] = ()


@dataclass
class RunHistory:
    """A run's calls, and the other events exactcall's readers use."""

    workflow_type: str = ""
    original_run_id: str | None = None
    start_input: Payload | None = None
    started_at: datetime | None = None
    calls: list[HistoryCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Activities that look like calls whose input does not decode as an intent."""
    signals: list[tuple[int, str, datetime, list[Payload]]] = field(default_factory=list)
    """Signals: event id, name, when, arguments."""
    updates: list[tuple[int, str, datetime, list[Payload]]] = field(default_factory=list)
    """Accepted updates: event id, name, when, arguments."""
    memos: list[tuple[datetime, dict[str, Payload]]] = field(default_factory=list)
    """Each memo upsert: when, and the fields it set."""
    children_started: dict[str, datetime] = field(default_factory=dict)
    children_completed: dict[str, Payload | None] = field(default_factory=dict)
    events: int = 0


async def read_history(
    events: Iterable[HistoryEvent] | AsyncIterable[HistoryEvent],
    conv: DataConverter,
    *,
    tools: Sequence[str] = (),
) -> RunHistory:
    """Read ``events`` (a history's, or ``fetch_history_events()``) once.

    ``tools``: names of exactcall tools, so that an activity of that type whose input does
    not decode is reported as a problem."""
    run = RunHistory()
    by_scheduled: dict[int, HistoryCall] = {}
    async for ev in _each(events):
        run.events += 1
        t = ev.event_type
        when = ev.event_time.ToDatetime(tzinfo=UTC)
        if t == _ET.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            a = ev.workflow_execution_started_event_attributes
            run.workflow_type = a.workflow_type.name
            run.original_run_id = a.original_execution_run_id or None
            run.start_input = a.input.payloads[0] if a.input.payloads else None
            run.started_at = when
        elif t == _ET.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            call = await _scheduled(ev, when, run, conv, tools)
            if call is not None:
                by_scheduled[ev.event_id] = call
                run.calls.append(call)
        elif t == _ET.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a_s = ev.activity_task_started_event_attributes
            if (c := by_scheduled.get(a_s.scheduled_event_id)) is not None:
                c.started, c.attempts = True, max(c.attempts, a_s.attempt)
        elif t == _ET.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a_c = ev.activity_task_completed_event_attributes
            if (c := by_scheduled.get(a_c.scheduled_event_id)) is not None:
                c.closed, c.closed_at = "completed", when
                c.result = a_c.result.payloads[0] if a_c.result.payloads else None
        elif t in (_ET.EVENT_TYPE_ACTIVITY_TASK_FAILED, _ET.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            failed = t == _ET.EVENT_TYPE_ACTIVITY_TASK_FAILED
            a_f = (
                ev.activity_task_failed_event_attributes
                if failed
                else ev.activity_task_timed_out_event_attributes
            )
            if (c := by_scheduled.get(a_f.scheduled_event_id)) is not None:
                c.closed, c.closed_at = ("failed" if failed else "timed_out"), when
                if failed and a_f.failure.HasField("application_failure_info"):
                    c.failure_type = a_f.failure.application_failure_info.type
                c.error_type, c.error, c.error_details = await _failure(conv, a_f.failure)
        elif t == _ET.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            a_x = ev.activity_task_canceled_event_attributes
            if (c := by_scheduled.get(a_x.scheduled_event_id)) is not None:
                c.closed, c.closed_at = "canceled", when
        elif t == _ET.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            a_g = ev.workflow_execution_signaled_event_attributes
            run.signals.append((ev.event_id, a_g.signal_name, when, list(a_g.input.payloads)))
        elif t == _ET.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
            run.updates.append((ev.event_id, req.input.name, when, list(req.input.args.payloads)))
        elif t == _ET.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            memo = ev.workflow_properties_modified_event_attributes.upserted_memo.fields
            run.memos.append((when, dict(memo)))
        elif t == _ET.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            child = ev.start_child_workflow_execution_initiated_event_attributes.workflow_id
            run.children_started.setdefault(child, when)
        elif t == _ET.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            a_d = ev.child_workflow_execution_completed_event_attributes
            payloads = a_d.result.payloads
            run.children_completed[a_d.workflow_execution.workflow_id] = (
                payloads[0] if payloads else None
            )
    return run


async def _each(
    events: Iterable[HistoryEvent] | AsyncIterable[HistoryEvent],
) -> AsyncIterable[HistoryEvent]:
    if isinstance(events, AsyncIterable):
        async for ev in events:
            yield ev
    else:
        for ev in events:
            yield ev


async def _scheduled(
    ev: HistoryEvent, when: datetime, run: RunHistory, conv: DataConverter, tools: Sequence[str]
) -> HistoryCall | None:
    a = ev.activity_task_scheduled_event_attributes
    payloads = list(a.input.payloads)
    try:
        if len(payloads) != 1:
            raise ValueError(f"{len(payloads)} input payloads, an exactcall call has 1")
        # decoded without a type hint, then validated: a converter with a lenient fallback
        # (the OpenAI Agents SDK's) would "decode" any activity input as an Intent
        [value] = await conv.decode(payloads)
        intent = intent_from_input(
            value, workflow_type=run.workflow_type, task_queue=a.task_queue.name
        )
    except Exception as exc:
        looks = _looks_like_a_call(a.activity_type.name, payloads, tools)
        if looks is not None:
            run.problems.append(
                f"activity {a.activity_type.name!r} (event {ev.event_id}, activity id "
                f"{a.activity_id!r}) looks like an exactcall call ({looks}) but its input "
                f"does not decode as an Intent: {_reason(exc)}; its intent cannot be "
                "checked (a changed Intent model, data converter or codec?)"
            )
        return None
    timeouts = [
        d.ToTimedelta()
        for d in (a.heartbeat_timeout, a.start_to_close_timeout)
        if d.seconds or d.nanos
    ]
    header = a.header.fields.get(READ_HEADER)
    read = None
    if header is not None:
        try:
            read = bool(conv.payload_converter.from_payload(header))
        except Exception:
            read = None
    return HistoryCall(
        event_id=ev.event_id,
        intent=intent,
        activity_id=a.activity_id,
        activity_type=a.activity_type.name,
        scheduled_at=when,
        min_timeout=min(timeouts) if timeouts else timedelta(0),
        read=read,
    )


def _looks_like_a_call(
    activity_type: str, payloads: Sequence[Payload], tools: Sequence[str]
) -> str | None:
    """Why an activity looks like an exactcall call, or None (a plain activity)."""
    if activity_type in tools:
        return f"{activity_type!r} is a registered exactcall tool"
    if activity_type in _WAITS:  # exactcall's own, on a reconciliation id: not a call
        return None
    if activity_type.startswith("exactcall."):
        return "an exactcall activity type"
    for payload in payloads:
        if payload.metadata.get("encoding") != b"json/plain":
            continue
        try:
            value = json.loads(payload.data)
        except ValueError:
            continue
        if isinstance(value, dict):
            fields = _INTENT_FIELDS & value.keys()
            if "args_hash" in fields or len(fields) >= 3:
                return f"its input has an intent's fields {sorted(fields)}"
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        errs = exc.errors(include_url=False)
        text = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errs[:3]
        )
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return f"{type(exc).__name__}: {text}{more}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


async def _failure(
    conv: DataConverter, failure: Any
) -> tuple[str | None, str | None, tuple[Any, ...]]:
    try:
        err = await conv.decode_failure(failure)
    except Exception:
        return None, failure.message or None, ()
    if isinstance(err, ApplicationError):
        return err.type or "ApplicationError", err.message, tuple(err.details)
    return type(err).__name__, str(err), ()
