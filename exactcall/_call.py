"""``exactcall.call``: run a tool from workflow code, with a persisted intent and a derived key.

Deterministic workflow code only. Per workflow instance it keeps the ordinal of each tool
(``pay#1``, ``pay#2``; carried over continue-as-new in a header) and the calls in flight by
key, so concurrent calls with one key execute once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from ._canonical import args_hash, derive_key
from ._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    NotExecuted,
    ToolFailed,
    error_from_failure,
)
from ._model import Intent
from ._settle import OnUnknown, reconcile
from ._tool import Tool, resolve_tool
from ._wait import needs_approval, wait_for_approval
from ._wfstate import Flight, state

__all__ = ["call", "call_with", "intent_of"]

MAX_KEY_LENGTH = 200
_NON_RETRYABLE = [
    "AmbiguousOutcome",
    "IntentConflict",
    "InvalidCall",
    "ResultNotSerializable",
    "ApprovalMissing",
]


async def call(
    tool: Tool | str,
    /,
    *args: Any,
    key: str | None = None,
    on_unknown: OnUnknown | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``tool(*args, **kwargs)`` once, from workflow code.

    ``key`` names the step (a deliberate repeat of the same call needs its own key); without
    it the step is the tool's next ordinal in this workflow (``pay#1``, ``pay#2``).
    ``on_unknown``: ``"wait"`` for the reconciliation's verdict when the outcome is unknown,
    or ``"raise"`` AmbiguousOutcome at once (reconciliation still runs). A tool that has its
    own parameter called ``key`` or ``on_unknown`` is called with :func:`call_with`.
    """
    t = resolve_tool(tool)
    for name, value in (("key", key), ("on_unknown", on_unknown)):
        if value is not None and name in t.params:
            raise InvalidCall(
                f"{t.name} has its own parameter {name!r}, so exactcall.call(..., {name}=...) "
                f"is ambiguous: use exactcall.call_with(tool, kwargs={{{name!r}: ...}}, "
                f"{name}=...)",
                tool=t.name,
            )
    return await call_with(t, args=args, kwargs=kwargs, key=key, on_unknown=on_unknown)


async def call_with(
    tool: Tool | str,
    /,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    on_unknown: OnUnknown | None = None,
) -> Any:
    """Like :func:`call`, with the tool's arguments passed apart from exactcall's options."""
    if not workflow.in_workflow():
        raise ExactcallError(
            "exactcall.call runs inside a Temporal workflow; to compute a hash outside one, "
            "use exactcall.intent_hash"
        )
    t = resolve_tool(tool)
    mode = on_unknown or t.options.on_unknown
    if mode not in ("wait", "raise"):
        raise InvalidCall(f"on_unknown={mode!r}: use 'wait' or 'raise'", tool=t.name)
    intent = intent_of(t, args, kwargs or {}, key)
    st = state()
    if t.options.read_only:
        return _typed(t, await execute_tool_activity(t, intent))
    flight = st.flights.get(intent.key)
    if flight is None:
        work = _approved_then_execute(t, intent, mode)
        flight = Flight(intent, asyncio.ensure_future(work))
        st.flights[intent.key] = flight
    elif flight.intent.args_hash != intent.args_hash:
        raise IntentConflict(
            f"step {intent.step!r} of {t.name} already ran in this workflow with args hash "
            f"{flight.intent.args_hash}; this call has {intent.args_hash}. Nothing was "
            "executed. Use another key= for a different call.",
            tool=t.name,
            step=intent.step,
            key=intent.key,
            args_hash=intent.args_hash,
            recorded_hash=flight.intent.args_hash,
        )
    return _typed(t, await asyncio.shield(flight.task))


def intent_of(t: Tool, args: Sequence[Any], kwargs: Mapping[str, Any], key: str | None) -> Intent:
    """Build (and validate) the intent of a call from inside a workflow."""
    canonical = t.canonical_args(args, kwargs)
    st = state()
    step = st.next_step(t.name) if key is None else _check_key(key)
    info = workflow.info()
    return Intent(
        tool=t.name,
        tool_version=t.version,
        args=canonical,
        args_hash=args_hash(t.name, canonical),
        namespace=info.namespace,
        workflow_id=info.workflow_id,
        workflow_type=info.workflow_type,
        step=step,
        key=derive_key(info.namespace, info.workflow_id, step, t.name, t.version),
        explicit_key=key is not None,
        record_task_queue=info.task_queue,
    )


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise InvalidCall(
            f"key={key!r}: a step key is a non-empty string of at most {MAX_KEY_LENGTH} characters",
        )
    return key


async def _approved_then_execute(t: Tool, intent: Intent, on_unknown: OnUnknown) -> Any:
    if needs_approval(t, intent):
        grant = await wait_for_approval(t, intent)
        intent = intent.model_copy(update={"approval": grant})
    try:
        return await execute_tool_activity(t, intent)
    except AmbiguousOutcome as err:
        return await reconcile(t, intent, err, on_unknown)


async def execute_tool_activity(t: Tool, intent: Intent, activity_id: str | None = None) -> Any:
    """Schedule the tool activity for ``intent``; exactcall errors come back typed."""
    opts = t.options
    if activity_id is None:
        activity_id = intent.step if not intent.explicit_key else f"{t.name}[{intent.step}]"
    try:
        return await workflow.execute_activity(
            t.name,
            intent,
            task_queue=opts.task_queue,
            start_to_close_timeout=opts.start_to_close_timeout,
            heartbeat_timeout=opts.heartbeat_timeout,
            retry_policy=_retry_policy(t),
            activity_id=activity_id,
            summary=f"{t.name} {intent.step} args {intent.args_hash[:12]}",
        )
    except ActivityError as err:
        raise _outcome_error(t, intent, err) from err


def _retry_policy(t: Tool) -> RetryPolicy:
    p = t.options.retry_policy
    if t.options.read_only:
        return p
    # crashed and timed-out attempts are always followed by one more attempt, which reads the
    # markers and settles the call; the attempt limit applies to definite failures and is
    # enforced inside the activity
    return RetryPolicy(
        initial_interval=p.initial_interval,
        backoff_coefficient=p.backoff_coefficient,
        maximum_interval=p.maximum_interval,
        maximum_attempts=0,
        non_retryable_error_types=_NON_RETRYABLE,
    )


def _outcome_error(t: Tool, intent: Intent, err: ActivityError) -> ExactcallError:
    cause = err.cause
    fields = {"tool": t.name, "step": intent.step, "key": intent.key, "args_hash": intent.args_hash}
    if isinstance(cause, ApplicationError):
        rebuilt = error_from_failure(cause)
        if isinstance(rebuilt, NotExecuted):
            return ToolFailed(
                f"{t.name} {intent.step} failed and did not happen: {cause.message}",
                **fields,
                error_type=(rebuilt.fields.get("error_type")),
            )
        if rebuilt is not None:
            return rebuilt
        return ToolFailed(f"{t.name} {intent.step} failed: {cause.message}", **fields)
    return ToolFailed(f"{t.name} {intent.step} failed: {err}", **fields)


def _typed(t: Tool, value: Any) -> Any:
    adapter = t.return_adapter()
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value)
    except pydantic.ValidationError:
        workflow.logger.warning(
            "exactcall: %s result does not fit its return annotation; returned as JSON", t.name
        )
        return value
