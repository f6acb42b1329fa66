"""The tool activity of a call, as the workflow schedules it: its id, its options and retry
policy, the header that says whether it is a read, and the exactcall error its failure is.

Deterministic workflow code only (the call path, ``_call``, and the reconciliation's re-run).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as ActivityCancelled
from temporalio.exceptions import TimeoutError as ActivityTimedOut
from temporalio.workflow import ActivityCancellationType

from exactcall._errors import ExactcallError, NotExecuted, ToolFailed, error_from_failure
from exactcall._model import Intent
from exactcall._tool import Tool
from exactcall._wire import READ_PATH_BY_DECLARATION
from exactcall.reconciliation._verdicts import CallSpec
from exactcall.workflows._state import SCHEDULING_A_READ
from exactcall.workflows._unknown import call_spec

__all__ = [
    "CRASH_RETRY_INTERVAL",
    "Interrupted",
    "call_activity_id",
    "execute_call_activity",
    "execute_tool_activity",
    "reads",
]

CRASH_RETRY_INTERVAL = timedelta(milliseconds=200)
"""Temporal's wait before the attempt that follows a crashed one (it reads the markers and
settles the call; it does not call the tool blindly)."""
_NON_RETRYABLE = [
    "AmbiguousOutcome",
    "IntentConflict",
    "InvalidCall",
    "ResultNotSerializable",
    "ApprovalMissing",
]


def reads(t: Tool) -> bool:
    """Whether the workflow runs this call as a read: the tool's declaration, except in
    histories from before READ_PATH_BY_DECLARATION, where a trusted MCP server's hint to the
    worker decided (replayed as recorded, on a worker that sees the same hint)."""
    if t.options.read_only:
        return True
    if t.reads_by_hint:
        return not workflow.patched(READ_PATH_BY_DECLARATION) and t.attempt_reads
    return False


def call_activity_id(t: Tool, intent: Intent) -> str:
    return intent.step if not intent.explicit_key else f"{t.name}[{intent.step}]"


async def execute_tool_activity(
    t: Tool,
    intent: Intent,
    activity_id: str | None = None,
    cancellation: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
) -> Any:
    """Schedule the tool activity for ``intent``; exactcall errors come back typed.

    ``cancellation``: a call's flight waits for a cancelled attempt to report what the tool
    did (WAIT_CANCELLATION_COMPLETED); read-only calls and re-runs are cancelled as usual."""
    if activity_id is None:
        activity_id = call_activity_id(t, intent)
    if reads(t):
        opts = t.options
        return await _schedule(
            t.name,
            intent,
            activity_id,
            cancellation,
            read=True,
            task_queue=opts.task_queue,
            start_to_close_timeout=opts.start_to_close_timeout,
            heartbeat_timeout=opts.heartbeat_timeout,
            retry_policy=opts.retry_policy,
        )
    return await execute_call_activity(call_spec(t), intent, activity_id, cancellation)


async def execute_call_activity(
    spec: CallSpec,
    intent: Intent,
    activity_id: str,
    cancellation: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
) -> Any:
    """Schedule the (side-effecting) tool activity of ``intent`` as ``spec`` says."""
    return await _schedule(
        intent.tool,
        intent,
        activity_id,
        cancellation,
        read=False,
        task_queue=spec.task_queue,
        start_to_close_timeout=spec.start_to_close_timeout,
        heartbeat_timeout=spec.heartbeat_timeout,
        retry_policy=_retry_policy(spec),
    )


async def _schedule(
    name: str,
    intent: Intent,
    activity_id: str,
    cancellation: ActivityCancellationType,
    *,
    read: bool,
    **options: Any,
) -> Any:
    # the intent without what the attempt knows from where it runs (WireIntent)
    task_queue = options.get("task_queue") or workflow.info().task_queue
    SCHEDULING_A_READ.set(read)  # its header says which it is (for readers of the history)
    try:
        handle = workflow.start_activity(
            name,
            intent.wire(task_queue),
            activity_id=activity_id,
            summary=f"{name} {intent.step} args {intent.args_hash[:12]}",
            cancellation_type=cancellation,
            **options,
        )
    finally:
        SCHEDULING_A_READ.set(None)
    try:
        return await handle
    except ActivityError as err:
        raise _outcome_error(name, intent, err) from err


def _retry_policy(spec: CallSpec) -> RetryPolicy:
    # crashed and timed-out attempts are always followed by one more attempt, which reads the
    # markers and settles the call; the attempt limit applies to definite failures and is
    # enforced inside the activity
    # a definite failure's own backoff is the tool's policy, given per failure by the attempt
    # (ApplicationError.next_retry_delay); what Temporal applies is the wait after a crash
    return RetryPolicy(
        initial_interval=CRASH_RETRY_INTERVAL,
        backoff_coefficient=spec.backoff_coefficient,
        maximum_interval=max(spec.maximum_interval or CRASH_RETRY_INTERVAL, CRASH_RETRY_INTERVAL),
        maximum_attempts=0,
        non_retryable_error_types=_NON_RETRYABLE,
    )


class Interrupted(ToolFailed):
    """The activity was cancelled or timed out without an attempt reporting an outcome."""


def _outcome_error(name: str, intent: Intent, err: ActivityError) -> ExactcallError:
    cause = err.cause
    fields: dict[str, Any] = {
        "tool": name,
        "step": intent.step,
        "key": intent.key,
        "args_hash": intent.args_hash,
    }
    if isinstance(cause, ActivityCancelled | ActivityTimedOut):
        return Interrupted(
            f"{name} {intent.step} was cancelled before an attempt reported: {cause}", **fields
        )
    if isinstance(cause, ApplicationError):
        rebuilt = error_from_failure(cause)
        if isinstance(rebuilt, NotExecuted):
            return ToolFailed(
                f"{name} {intent.step} failed and did not happen: {cause.message}",
                **fields,
                error_type=(rebuilt.fields.get("error_type")),
            )
        if rebuilt is not None:
            return rebuilt
        return ToolFailed(f"{name} {intent.step} failed: {cause.message}", **fields)
    return ToolFailed(f"{name} {intent.step} failed: {err}", **fields)
