"""``exactcall.call``: run a tool from workflow code, with a persisted intent and a derived key.

Deterministic workflow code only. Per workflow instance it keeps the ordinal of each tool
(``pay#1``, ``pay#2``; carried over continue-as-new in a header) and the calls in flight by
key, so concurrent calls with one key execute once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    is_cancelled_exception,
)
from temporalio.workflow import ActivityCancellationType

from exactcall._canonical import args_hash, derive_key
from exactcall._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    ResultNotSerializable,
)
from exactcall._metrics import CALLS, count, observed_approval
from exactcall._model import Intent
from exactcall._tool import Tool, resolve_tool
from exactcall._wire import (
    BUDGET_REFUSALS_RECORDED,
    BUDGETS_PATCH,
    REFUSED_MEMO,
)
from exactcall.budgets._budget import BudgetExceeded, over_text
from exactcall.reconciliation._verdicts import CallAbandoned
from exactcall.workflows._approval_wait import wait_for_approval
from exactcall.workflows._budget_calls import (
    keep_for,
    reserve_for,
    reserve_overruns,
    settle_for,
    spend_for,
)
from exactcall.workflows._saga_stage import note_done, note_in_doubt
from exactcall.workflows._schedule import (
    Interrupted,
    call_activity_id,
    execute_tool_activity,
    reads,
)
from exactcall.workflows._state import Flight, cancellation_reaches_calls, state
from exactcall.workflows._unknown import (
    OnUnknown,
    await_verdict,
    reconciling,
    settle_activity_id,
    start_reconciliation,
    tell_cancelled,
)

__all__ = ["call", "call_with", "intent_conflict", "intent_of"]

MAX_KEY_LENGTH = 200
_WAIT = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED


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
    given = on_unknown or t.options.on_unknown
    if given not in ("wait", "raise"):
        raise InvalidCall(f"on_unknown={given!r}: use 'wait' or 'raise'", tool=t.name)
    mode: OnUnknown = "wait" if given == "wait" else "raise"
    intent = intent_of(t, args, kwargs or {}, key)
    st = state()
    if reads(t):  # cancelled like a plain activity (not awaited)
        try:
            return _typed(t, await _read(t, intent))
        except Interrupted as err:
            if cancellation_reaches_calls():
                raise asyncio.CancelledError(err.message) from None
            raise
    flight = st.flights.get(intent.key)
    if flight is None:
        flight = Flight(intent)
        st.flights[intent.key] = flight.start(_run_flight(t, intent, mode, flight))
    elif flight.intent.args_hash != intent.args_hash:
        count(CALLS, tool=t.name, outcome="conflict")
        raise _conflict(t, intent, "already ran", flight.intent.args_hash)
    try:
        result = _typed(t, await _join(flight))
    except AmbiguousOutcome:
        note_in_doubt(intent)  # on_unknown="raise": a saga waits for the verdict to undo
        raise
    note_done(intent, result)
    return result


def _refusal(intent: Intent, err: BudgetExceeded, at: datetime) -> dict[str, Any]:
    """A refused call as its run's memo records it (``exactcall audit`` reads each one)."""
    i = intent
    return {
        **{k: getattr(i, k) for k in ("workflow_id", "step", "tool", "args", "args_hash", "key")},
        "tool_version": i.tool_version,
        "at": at.isoformat(),
        "budget": err.fields.get("budget"),
        "message": err.message,
    }


def _conflict(t: Tool, intent: Intent, what: str, recorded_hash: str) -> IntentConflict:
    return intent_conflict(t, intent, what, recorded_hash, "in this workflow")


def intent_conflict(
    t: Tool, intent: Intent | Any, what: str, recorded_hash: str, where: str
) -> IntentConflict:
    """IntentConflict: ``intent`` (anything with ``step``, ``args_hash`` and maybe ``key``)
    has another args hash than the one its step ``what`` (``already ran``) ``where``."""
    return IntentConflict(
        f"step {intent.step!r} of {t.name} {what} {where} with args hash "
        f"{recorded_hash}; this call has {intent.args_hash}. Nothing was executed. Use "
        "another key= for a different call.",
        tool=t.name,
        step=intent.step,
        key=getattr(intent, "key", None),
        args_hash=intent.args_hash,
        recorded_hash=recorded_hash,
    )


async def _read(t: Tool, intent: Intent) -> Any:
    """A read-only call. Reads are not shared, except concurrent ones with one explicit key:
    their activity id comes from the key, so they are one activity (same arguments) or an
    IntentConflict (other arguments), never two activities with one id."""
    if not intent.explicit_key:
        return await execute_tool_activity(t, intent)
    reads = state().reads
    running = reads.get(intent.key)
    if running is not None and not running[1].done():
        if running[0] != intent.args_hash:
            raise _conflict(t, intent, "is being read", running[0])
        return await asyncio.shield(running[1])
    task = asyncio.ensure_future(execute_tool_activity(t, intent))
    reads[intent.key] = (intent.args_hash, task)
    try:
        return await task
    finally:
        if reads.get(intent.key, (None, None))[1] is task:
            del reads[intent.key]


async def _join(flight: Flight) -> Any:
    """Wait for a call shared by every caller of its key.

    A cancelled caller gets CancelledError; the call goes on for the others. When the last
    caller waiting is cancelled (a cancelled workflow cancels them all), the call itself is
    cancelled and this caller waits until it has settled (its record says what happened, an
    unknown outcome has gone to reconciliation) before CancelledError propagates.
    """
    flight.waiters += 1
    try:
        return await asyncio.shield(flight.task)
    except asyncio.CancelledError:
        if flight.waiters == 1 and not flight.task.done() and cancellation_reaches_calls():
            flight.cancel()
            await flight.finished()
        raise
    finally:
        flight.waiters -= 1


def intent_of(t: Tool, args: Sequence[Any], kwargs: Mapping[str, Any], key: str | None) -> Intent:
    """Build (and validate) the intent of a call from inside a workflow."""
    canonical = t.canonical_args(args, kwargs)
    st = state()
    step = st.next_step(t.name) if key is None else _check_key(key)
    info = workflow.info()
    wid = st.calls_of or info.workflow_id
    return Intent(
        tool=t.name,
        tool_version=t.version,
        args=canonical,
        args_hash=args_hash(t.name, canonical),
        namespace=info.namespace,
        workflow_id=wid,
        workflow_type=info.workflow_type,
        step=step,
        key=derive_key(info.namespace, wid, step, t.name, t.version),
        explicit_key=key is not None,
        record_task_queue=info.task_queue,
    )


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise InvalidCall(
            f"key={key!r}: a step key is a non-empty string of at most {MAX_KEY_LENGTH} characters",
        )
    return key


async def _run_flight(t: Tool, intent: Intent, on_unknown: OnUnknown, flight: Flight) -> Any:
    """Approval, then the tool activity, then (for an unknown outcome) the reconciliation.

    Cancelled while waiting for approval: the request is withdrawn. Cancelled while the
    activity is scheduled or running: the activity is cancelled and its outcome awaited (the
    tool sees the cancellation through its heartbeat); when no attempt reported one (it had
    not started, or its worker died), one more attempt settles the call from its markers
    without calling the tool.
    """
    if t.options.budgets and workflow.patched(BUDGETS_PATCH):
        return await _budgeted(t, intent, on_unknown, flight)
    if t.needs_approval(intent):
        grant = await observed_approval(t.name, wait_for_approval(t, intent))
        intent = intent.model_copy(update={"approval": grant})
    return await _run_tool(t, intent, on_unknown, flight)


async def _budgeted(t: Tool, intent: Intent, on_unknown: OnUnknown, flight: Flight) -> Any:
    """Reserve on each budget, then (over a limit, or by the tool's rule) wait for a person,
    then run; the outcome spends or releases the reservations (an unknown one keeps them until
    its reconciliation settles)."""
    held, over = await reserve_for(t, intent)
    refused = [o for o in over if o.budget.on_exceed == "refuse"]
    if refused:
        await settle_for(held, spent=False)
        o = refused[0]
        why = over_text(o.budget, o.op.window, o.answer, o.op.measure)
        err = BudgetExceeded(
            f"{t.name} {intent.step} would pass the {why}; nothing ran",
            tool=t.name,
            step=intent.step,
            args_hash=intent.args_hash,
            budget=o.budget.name,
            window=o.op.window,
            spent=o.answer.spent,
            reserved=o.answer.reserved,
            measure=o.op.measure,
            limit=o.answer.limit,
        )
        if workflow.patched(BUDGET_REFUSALS_RECORDED):  # for exactcall audit
            workflow.upsert_memo({REFUSED_MEMO: _refusal(intent, err, workflow.now())})
        raise err
    try:
        if over or t.needs_approval(intent):
            reasons = tuple(over_text(o.budget, o.op.window, o.answer, o.op.measure) for o in over)
            grant = await observed_approval(t.name, wait_for_approval(t, intent, reasons))
            intent = intent.model_copy(update={"approval": grant})
            held += await reserve_overruns(over, grant.approved_by)
    except BaseException:
        await settle_for(held, spent=False)  # denied, expired or cancelled: nothing ran
        raise
    try:
        result = await _run_tool(t, intent, on_unknown, flight)
    except AmbiguousOutcome:
        keep_for(held)  # unknown: kept until its reconciliation settles it
        raise
    except (CallAbandoned, ResultNotSerializable):
        await settle_for(held, spent=True)  # it may have happened: the charge stands
        raise
    except BaseException:
        await settle_for(held, spent=False)
        raise
    await spend_for(held)  # sent with the run's next reservation, or when its code ends
    return result


async def _run_tool(t: Tool, intent: Intent, on_unknown: OnUnknown, flight: Flight) -> Any:
    try:
        return await execute_tool_activity(t, intent, cancellation=_WAIT)
    except AmbiguousOutcome as err:
        return await _reconcile(t, intent, err, on_unknown, flight)
    except (Interrupted, asyncio.CancelledError):
        if not flight.cancelled:
            raise
        return await _settle_cancelled(t, intent, flight)


async def _reconcile(
    t: Tool, intent: Intent, err: AmbiguousOutcome, on_unknown: OnUnknown, flight: Flight
) -> Any:
    flight.interruptible = False  # the reconciliation starts even if the call is cancelled now
    was_cancelled = flight.cancelled
    try:
        child = await start_reconciliation(t, intent, err, cancelled=was_cancelled)
        if flight.cancelled and not was_cancelled:
            await tell_cancelled(intent)
    finally:
        flight.interruptible = True
    if on_unknown == "raise" or flight.cancelled:
        raise reconciling(err, intent)
    try:
        return await await_verdict(t, intent, child, lambda: flight.cancelled)
    except BaseException as exc:
        if flight.cancelled and is_cancelled_exception(exc):
            # the reconciliation goes on without the caller (it outlives the workflow), and
            # will not re-run a call whose workflow was cancelled
            flight.interruptible = False
            await tell_cancelled(intent)
            raise asyncio.CancelledError() from None
        raise


async def _settle_cancelled(t: Tool, intent: Intent, flight: Flight) -> Any:
    """The cancelled activity ended with no word from an attempt: read the markers."""
    flight.interruptible = False
    base = call_activity_id(t, intent)
    try:
        return await execute_tool_activity(t, intent, settle_activity_id(base), _WAIT)
    except AmbiguousOutcome as err:
        await start_reconciliation(t, intent, err, cancelled=True)
        raise reconciling(err, intent) from None


def _typed(t: Tool, value: Any) -> Any:
    typed, fits = t.typed_result(value)
    if not fits:
        workflow.logger.warning(
            "exactcall: %s result does not fit its return annotation; returned as JSON", t.name
        )
    return typed
