"""The tool's call, once the attempt decided to make it (``_decision``), and what its outcome
writes: the activity's completion by its task token (the done marker of an attempt that owns
the call), else a ``done`` record; ``released`` for a definite failure; ``unknown`` for any
other error, which routes the call to its reconciliation."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._canonical import to_json_value
from exactcall._context import running
from exactcall._crash import maybe_crash, note_execution
from exactcall._errors import AmbiguousOutcome, InvalidCall, NotExecuted, ResultNotSerializable
from exactcall.activities._cancelling import ToolCancelled, durably
from exactcall.activities._claim import holding
from exactcall.activities._markers import Markers, describe
from exactcall.reconciliation._verdicts import (
    RECONCILE_STATE_QUERY,
    RESOLVE_SIGNAL,
    ReconcileState,
    Resolution,
    reconcile_id,
)

__all__ = ["LATE_ATTEMPT", "REPORTED", "ToolCall"]

LATE_ATTEMPT = "exactcall (a late attempt)"
"""Who decided, when a late attempt's recorded result settled a parked call as landed."""
LATE_TRIES = 10
"""How many times (every 0.5 s) a late attempt offers its result to the call's
reconciliation, while there is none yet or it has not parked the call yet (it starts
"probing", and parks a call without a probe at once)."""
REPORTED: Any = object()
"""An attempt's return value when it completed its activity itself (by task token)."""


class ToolCall:
    """One call of the tool by one attempt, and the markers its outcome writes.

    ``owns``: the attempt owns the call (it claimed the record, or its run holds the workflow
    id's claim), so its completion is the done marker. ``fast``: it is on the fast path, which
    writes the record only off the happy path."""

    def __init__(self, m: Markers, *, owns: bool = False, fast: bool = False) -> None:
        self.m = m
        self.owns = owns
        self.fast = fast

    async def read(self) -> Any:
        """A read-only tool: called with no markers, and its errors are its own."""
        return await self._invoke(beat_phase="read_only")

    async def run(self) -> Any:
        """Call the tool (its pre-call markers are written) and record the outcome."""
        m, i = self.m, self.m.intent
        maybe_crash("in_call", i.tool, m.info.attempt, i.step)
        try:
            result = await self._invoke(beat_phase="calling")
        except Exception as exc:
            return await self._failed(exc)
        maybe_crash("after_call", i.tool, m.info.attempt, i.step)
        try:
            value = to_json_value(result, f"{i.tool}() result")
        except InvalidCall as exc:
            await m.done(None, unserializable=exc.message)
            raise ResultNotSerializable(
                f"{i.tool} {i.step} ran (recorded as done, it will not run again under this "
                f"key), but its result cannot be recorded: {exc.message}. Return JSON data, a "
                "pydantic model or a dataclass.",
                **m.fields(),
            ) from None
        reported = self.owns and not m.cancel.why and await self._report(value)
        if not reported:
            await m.done(value)
            # late (its claim lost, or its completion refused): the call may be parked
            if m.claim.lost is not None or (self.owns and not m.cancel.why):
                await self._tell_a_parked_reconciliation(value)
        maybe_crash("after_record", i.tool, m.info.attempt, i.step)
        m.log.info("tool.executed")
        return REPORTED if reported else value

    async def _report(self, value: Any) -> bool:
        """Complete this activity with the call's result, by its task token: the completion
        is the call's done marker (in the owner run's history). False if the server refused
        it (the run was reset or closed, or this attempt timed out): the record keeps it."""
        try:
            await durably(self.m.handle.complete(value), self.m.cancel.by_worker)
        except Exception as exc:
            self.m.log.warning("tool.completion_refused", error=describe(exc))
            return False
        return True

    async def _invoke(self, beat_phase: str) -> Any:
        m, t = self.m, self.m.tool
        pos, kw = t.arguments_for_call(m.intent.args)
        if t.takes_key:
            kw["idempotency_key"] = m.intent.key
        if beat_phase != "read_only":
            i = m.intent
            note_execution(i.tool, i.step, i.key, m.info.attempt, i.workflow_id)
        m.claim.loop = asyncio.get_running_loop()
        m.claim.check = lambda: m.handle.heartbeat({"phase": beat_phase, "attempt": m.info.attempt})
        # the tool's task (or thread) copies this context
        with running(m.intent), holding(m.claim):
            if t.is_async:
                run = asyncio.ensure_future(t.fn(*pos, **kw))
            else:
                run = asyncio.ensure_future(asyncio.to_thread(t.fn, *pos, **kw))
        async with m.keepalive({"phase": beat_phase, "attempt": m.info.attempt}):
            return await m.cancel.outcome(run)

    async def _failed(self, exc: Exception) -> Any:
        m, opts = self.m, self.m.tool.options
        if isinstance(exc, (NotExecuted, *opts.not_executed_on)):
            await m.mark("released", reason=describe(exc))
            await m.beat({"phase": "released", "attempt": m.info.attempt})
            final = self._final_attempt(exc) or m.cancel.by_workflow
            m.log.info("tool.not_executed", error=describe(exc), final=final)
            raise ApplicationError(
                describe(exc),
                {"error_type": type(exc).__name__, "attempt": m.info.attempt},
                type=NotExecuted.code,
                non_retryable=final,
                next_retry_delay=self._backoff(),
            ) from exc
        retried = not m.cancel.by_workflow  # a cancelled call is not retried
        if opts.provider_idempotent is not False and retried and not self._final_attempt(exc):
            # the provider dedupes on the key: the next attempt re-calls with the same key
            m.log.warning("tool.error_retry_same_key", error=describe(exc))
            if self.fast:
                # off the happy path, the fast path writes the record too: a cancel in the
                # back-off leaves no trace of this attempt in the history
                await m.mark("calling")
            raise ApplicationError(
                describe(exc), type="ToolError", next_retry_delay=self._backoff()
            ) from exc
        reason = f"the tool raised {describe(exc)} after it may have started its effect"
        if m.cancel.why and not isinstance(exc, ToolCancelled):
            reason = f"{reason} ({m.cancel.why})"
        await m.unknown(reason)
        raise AmbiguousOutcome(
            f"{m.intent.tool} {m.intent.step}: outcome unknown; not re-sent. {reason}. "
            "Raise exactcall.NotExecuted (or list the type in not_executed_on=) when an error "
            "means the effect did not happen.",
            **m.fields(reason=reason, error_type=type(exc).__name__),
        ) from exc

    def _backoff(self) -> timedelta:
        """The tool's own retry policy, for a definite failure: the activity's policy starts
        retrying quickly, so that the attempt after a crash settles the call at once."""
        p = self.m.tool.options.retry_policy
        delay = p.initial_interval.total_seconds() * p.backoff_coefficient ** max(
            0, self.m.info.attempt - 1
        )
        cap = p.maximum_interval.total_seconds() if p.maximum_interval else delay
        return timedelta(seconds=min(delay, cap))

    def _final_attempt(self, exc: Exception) -> bool:
        policy = self.m.tool.options.retry_policy
        if isinstance(exc, NotExecuted) and exc.non_retryable:
            return True
        if type(exc).__name__ in (policy.non_retryable_error_types or ()):
            return True
        return 0 < policy.maximum_attempts <= self.m.info.attempt

    async def _tell_a_parked_reconciliation(self, value: Any) -> None:
        """This attempt made the call after all, late (its claim was lost, or the server
        refused its completion): a reconciliation that parked the call for a person meanwhile
        settles it as landed with this result. The reconciliation takes it only while parked;
        most late attempts have none (the next attempt then finds the result recorded). A
        tool with a probe needs none: its reconciliation asks the probe once this attempt
        can no longer act."""
        m = self.m
        if m.in_reconciliation or m.tool.options.reconcile is not None:
            return
        handle = activity.client().get_workflow_handle(reconcile_id(m.intent.key))
        why = f"attempt {m.info.attempt} made the call after its outcome was unknown"
        for _ in range(LATE_TRIES):
            res = Resolution(
                verdict="landed",
                result=value,
                by=LATE_ATTEMPT,
                reason=why,
                resolution_id=uuid.uuid4().hex,
            )
            try:
                await durably(handle.signal(RESOLVE_SIGNAL, res), m.cancel.by_worker)
                await asyncio.sleep(0.5)
                st = await handle.query(RECONCILE_STATE_QUERY, result_type=ReconcileState)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    m.log.info("tool.late_result_not_told", error=describe(exc))
                    return
                # none yet: a successor that read the record before this result was on it
                # may be starting one now
                await asyncio.sleep(0.5)
                continue
            if st.phase != "probing":  # it took it, or was settled otherwise
                m.log.info("tool.late_result_told", phase=st.phase)
                return
        self.m.log.info("tool.late_result_not_told", error="no parked reconciliation")
