"""The tool activity: one attempt of one call, which knows what earlier attempts did.

Markers, in the order they are written (each is durable before the next step runs):

1. the call record exists (workflow id = derived key) with phase ``calling`` and this
   attempt's chain as owner — written *before* the tool is called, visible to every run;
2. this attempt's heartbeat details say ``calling`` — a synchronous heartbeat, which also
   proves this attempt is still the live one (a stale attempt's heartbeat is refused);
3. the tool runs, heartbeated by exactcall while it does (synchronously, and through the
   worker, which otherwise times the attempt out after heartbeat_timeout + a few seconds);
4. the attempt completes its activity with the result, by its task token: the completion,
   in the owner run's history, is the ``done`` marker that a reader of the record finds
   (``Record.read``); nothing more is written. Only when that cannot be (the attempt was not
   the one that claimed the record, it was cancelled, or the server refused the completion:
   the run was reset or closed, or the attempt timed out) does the record get ``done`` with
   the result. It gets ``released`` when the tool says it did not happen, and ``unknown``.

An attempt that finds (1) without (2) from its own chain knows the tool was never called.
One that finds (2), or (1) from another chain, knows the tool may have been called: it
re-calls only a provider-idempotent tool (same key), and otherwise ends as AmbiguousOutcome.

Cancellation (see ``_cancelling``): cancelled before the tool was called, the key is released
(NotExecuted); afterwards the tool is told and decides: it returns (done), raises NotExecuted
(released), or anything else (unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from temporalio import activity
from temporalio.client import AsyncActivityCancelledError, AsyncActivityHandle
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._canonical import args_hash, derive_key, to_json_value
from exactcall._context import running
from exactcall._crash import maybe_crash, note_execution
from exactcall._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    NotExecuted,
    ResultNotSerializable,
)
from exactcall._metrics import observed_attempt
from exactcall._model import Intent, Owner, RecordEvent, RecordState, WireIntent
from exactcall._tool import Tool
from exactcall._undo import is_undo_step
from exactcall._verdicts import (
    RECONCILE_WORKFLOW,
    RESOLVE_SIGNAL,
    STATE_QUERY,
    CallAbandoned,
    ReconcileState,
    Resolution,
    reconcile_id,
    reconcile_input,
    reconcile_start_options,
)
from exactcall._wire import SETTLE_PREFIX, undo_id
from exactcall.approvals._binding import ApprovalMissing

from . import _runs as runs
from ._cancelling import BY_WORKFLOW, Cancellation, ToolCancelled, durably
from ._claim import Claim, clock, holding
from ._records import Record, RecordView

__all__ = ["tool_activity"]

log = structlog.get_logger("exactcall")

LATE_ATTEMPT = "exactcall (a late attempt)"
"""Who decided, when a late attempt's recorded result settled a parked call as landed."""
LATE_TRIES = 10
"""How many times (every 0.5 s) a late attempt offers its result to the call's
reconciliation, while there is none yet or it has not parked the call yet (it starts
"probing", and parks a call without a probe at once)."""
REPORTED: Any = object()
"""An attempt's return value when it completed its activity itself (by task token)."""


def tool_activity(
    t: Tool, *, run_claims: bool = True, fail_stop: bool = True
) -> Callable[[WireIntent], Awaitable[Any]]:
    """The Temporal activity (named like the tool) that runs ``t`` under exactcall.

    Its input is the call's intent in its wire form (an older full Intent reads the same).
    ``run_claims``: claim each workflow id once per run (``_runs``); False claims every call
    with a per-call record, as exactcall 0.1 did. ``fail_stop``: the worker process stops
    itself when a sync tool of an attempt that lost its claim to run still runs (``_claim``).
    """

    async def run(wire: WireIntent) -> Any:
        info = activity.info()
        intent = wire.complete(workflow_type=info.workflow_type or "", task_queue=info.task_queue)
        attempt = Attempt(t, intent, run_claims=run_claims, fail_stop=fail_stop)
        with observed_attempt(attempt):  # the call's outcome metric, and its span
            result = await attempt.run()
        if result is REPORTED:  # completed by its task token already: nothing to send
            activity.raise_complete_async()
        return result

    run.__name__ = run.__qualname__ = f"exactcall_tool_{t.name}"
    run.__doc__ = f"exactcall tool activity for {t.name!r}"
    return activity.defn(name=t.name)(run)


class Attempt:
    """One attempt of one call."""

    deduplicated = False
    """The record already had the call's result (for the outcome metric and span)."""
    claimed = False
    """This attempt owns the call: it created the call's record, or its run holds the
    workflow id's claim (its completion will be the done marker)."""
    beaten = False
    """This attempt's pre-call heartbeat ("calling") is written."""
    fast = False
    """This attempt's run holds the workflow id's claim (no per-call record on the happy
    path)."""

    def __init__(
        self, t: Tool, intent: Intent, *, run_claims: bool = True, fail_stop: bool = True
    ) -> None:
        info = activity.info()
        self.run_claims = run_claims
        self.fail_stop = fail_stop
        self.claim = Claim(t.options.heartbeat_timeout.total_seconds())
        """This attempt's claim to run, as its worker sees it (``_claim``)."""
        self.tool = t
        self.intent = intent
        self.info = info
        chain = info.activity_id
        self.settling = chain.startswith(SETTLE_PREFIX)
        if self.settling:  # settles the chain of the cancelled activity, from its markers
            chain = chain[len(SETTLE_PREFIX) :]
        self.owner = Owner(run_id=info.workflow_run_id or "", activity_id=chain)
        self.cancel = Cancellation(self)
        self.handle: AsyncActivityHandle = activity.client().get_async_activity_handle(
            task_token=info.task_token
        )
        self.record = Record(activity.client(), intent)
        self.log = log.bind(
            tool=intent.tool,
            step=intent.step,
            key=intent.key,
            workflow_id=intent.workflow_id,
            args_hash=intent.args_hash,
            attempt=info.attempt,
        )

    @property
    def previous_phase(self) -> str | None:
        details = self.info.heartbeat_details
        if details and isinstance(details[0], dict):
            return details[0].get("phase")
        return None

    async def run(self) -> Any:
        self._check_intent()
        if self.tool.attempt_reads:
            if self.settling:  # a cancelled read (by a trusted MCP hint): nothing to settle
                raise NotExecuted(f"{self.tool.name} is read-only here: it changed nothing")
            return await self._invoke(beat_phase="read_only")
        if self.settling:
            return await self.cancel.settle()
        return await self._decide()

    def unchanged_details(self) -> dict[str, Any]:
        """Liveness heartbeats while deciding must not erase what earlier attempts wrote."""
        details = self.info.heartbeat_details
        if details and isinstance(details[0], dict):
            return dict(details[0])
        return {"phase": None}

    # -- deciding -------------------------------------------------------------------------
    async def _decide(self) -> Any:
        maybe_crash("before_claim", self.intent.tool, self.info.attempt, self.intent.step)
        if self.previous_phase == "done":
            return await self._finish_recording()
        if self.in_reconciliation:  # a re-run by the reconciliation: its record says it all
            return await self._decide_by_record()
        if self.in_undo_run:  # the run that holds the id may have made it (by its history)
            return await self._settle_slow(
                await runs.holder(activity.client(), self.intent.workflow_id) or ""
            )
        if not self.run_claims:  # per-call records; the run's claim names no run
            client = activity.client()
            await runs.claimant(client, self.intent, self.owner.run_id, fast=False)
            return await self._decide_by_record()
        # the run's claim (cached after the run's first call), with this chain's first
        # pre-call heartbeat in the same round trip; a provider-idempotent tool's first
        # attempt needs none
        first = self.previous_phase is None
        holder = await self._claim_run(
            beat=first and not (self.beat_free and self.info.attempt == 1)
        )
        if holder == self.owner.run_id:
            if is_undo_step(self.intent.step) and first:
                # an undo may also be made by `exactcall undo`, outside this run, under the
                # same key: the key's record decides who makes it (and the other gets its
                # result)
                return await self._decide_by_record()
            return await self._settle_fast()
        return await self._settle_slow(holder)

    async def _claim_run(self, beat: bool) -> str:
        """Who holds the run claim of the call's workflow id (claimed for this run if
        nobody does); with ``beat``, the pre-call heartbeat is written at the same time."""
        claim = runs.claimant(activity.client(), self.intent, self.owner.run_id)
        if not beat:
            return await durably(claim, self.cancel.by_worker)
        both = asyncio.gather(
            claim, self.beat({"phase": "calling", "attempt": self.info.attempt}, via_worker=False)
        )
        holder, _ = await durably(both, self.cancel.by_worker)
        self.beaten = True
        return holder

    @property
    def beat_free(self) -> bool:
        """A provider-idempotent tool on the fast path writes nothing before the call: an
        attempt that follows one that may have called re-sends it with the same key anyway
        (inside the provider's window), which is all a pre-call heartbeat would tell it."""
        return self.run_claims and self.tool.options.provider_idempotent is not False

    @property
    def in_reconciliation(self) -> bool:
        return self.info.workflow_id == reconcile_id(self.intent.key)

    @property
    def in_undo_run(self) -> bool:
        """Made by ``exactcall undo``: an undo of the call's workflow, made in the undo
        workflow of that id (``undo_id``), under the key the workflow's saga would use."""
        i = self.intent
        return is_undo_step(i.step) and self.info.workflow_id == undo_id(i.workflow_id)

    async def _settle_fast(self) -> Any:
        """The claimant run: no earlier run of its workflow id made calls, so this chain's
        own heartbeats (and the per-call record, written only off the happy path) say
        everything about this call."""
        self.fast = True
        if self.beat_free and self.previous_phase is None:
            if self.info.attempt == 1:  # the fast path with no marker before the call
                self.claimed = True
                return await self._call(beat=False)
            # an earlier attempt called it with no marker, or crashed before: re-send with
            # the same key inside the provider's window, else unknown
            return await self._maybe_called(self._calling_view(self.owner))
        if self.beaten:  # nothing earlier in this chain: the pre-call heartbeat is written
            self.claimed = True
            return await self._call(beat=False)
        async with self.keepalive(self.unchanged_details(), via_worker=False):
            view = await self.record.read(claimant=False)
        if view is not None:
            return await self._by_record(view)
        if self.previous_phase == "calling":  # an earlier attempt may have called it
            return await self._maybe_called(self._calling_view(self.owner))
        self.claimed = True  # released earlier, with no record since (retention): never called
        return await self._call()

    def _calling_view(self, owner: Owner, since: datetime | None = None) -> RecordView:
        """What a per-call record would say had ``owner``'s run (which holds the claim, so
        writes none on the happy path) written one: ``owner`` may be calling the tool."""
        state = RecordState(intent=self.intent, phase="calling", owner=owner)
        return RecordView(state=state, since=since or self.info.scheduled_time, closed=True)

    async def _settle_slow(self, holder: str) -> Any:
        """Any run but the claimant: the per-call records hold what every other run did;
        the claimant's own calls are read from its history and describe."""
        if holder:
            seen = await runs.claimant_call(
                activity.client(), self.intent.workflow_id, holder, self.intent.key
            )
            if seen.status == "open" and self.in_undo_run:
                return await self._decide_by_record()  # it makes its undos by the record
            if seen.status == "open":
                # the claimant is open, so this attempt's own run has closed (one open run
                # per id): the claimant owns the call now; this stale attempt calls nothing
                raise ApplicationError(
                    f"{self.intent.tool} {self.intent.step}: this attempt's run has closed "
                    "and another run of the workflow id holds its calls; nothing was executed",
                    {"error_type": "StaleAttempt", "attempt": self.info.attempt},
                    type=NotExecuted.code,
                    non_retryable=True,
                )
            recorded_hash = seen.args_hash
            if (
                seen.status in ("done", "in_doubt")
                and recorded_hash is not None
                and not self.same_call(recorded_hash)
            ):
                raise self._conflict(str(recorded_hash))
            if seen.status == "done":
                self.deduplicated = True
                self.log.info("tool.deduplicated", recorded_by=holder)
                return seen.result
            if seen.status == "in_doubt":
                async with self.keepalive(self.unchanged_details(), via_worker=False):
                    view = await self.record.read(claimant=False)
                if view is not None and view.state.final:
                    return await self._by_record(view)
                if view is None or view.state.phase != "unknown":
                    chain = Owner(run_id=holder, activity_id=self.owner.activity_id)
                    view = self._calling_view(chain, seen.scheduled_at)
                return await self._maybe_called(view, why=seen.why)
        return await self._decide_by_record()

    async def _decide_by_record(self) -> Any:
        """The per-call record protocol: claim the key's record, or follow what it says."""
        if await self._claim_and_beat():
            return await self._call(beat=False)
        async with self.keepalive(self.unchanged_details(), via_worker=False):
            view = await self.record.read(claimant=False)
        if view is None:  # a record that vanished (retention): claim it anew
            if await self.record.claim(self.owner, self.info.attempt):
                self.claimed = True
                return await self._call()
            view = await self._must_read()
        return await self._by_record(view)

    async def own_chain_doubt(self) -> str:
        """For the settling attempt of a cancelled chain that left no record: why that chain
        may have called the tool, when this run holds the claim ("" when it cannot have, or
        when the run used per-call records, whose absence then says it was never called)."""
        if self.in_reconciliation or self.in_undo_run or not self.run_claims:
            return ""
        client = activity.client()
        holder = await runs.claimant(client, self.intent, self.owner.run_id)
        if holder != self.owner.run_id:
            return ""
        chains = await runs.run_chains(client, self.intent.workflow_id, self.owner.run_id)
        chain_id = self.owner.activity_id
        mine = [c for c in chains.get(self.intent.key, []) if c.activity_id == chain_id]
        return next((why for chain in mine if (why := runs.chain_doubt(chain))), "")

    def same_call(self, recorded_hash: str) -> bool:
        """Whether a hash recorded for this key (maybe by an older deploy of the tool) names
        this attempt's call: see ``Tool.same_call`` (a parameter added with a default that
        the call leaves at it keeps the identity, in either direction)."""
        if recorded_hash == self.intent.args_hash:
            return True
        try:  # this intent's args as the tool binds them now (an older intent gains defaults)
            now = self.tool.canonical_args((), self.intent.args)
        except ExactcallError:
            now = dict(self.intent.args)
        return self.tool.same_call(recorded_hash, now)

    def _conflict(self, recorded_hash: str) -> IntentConflict:
        self.log.warning("tool.conflict", recorded_hash=recorded_hash)
        return IntentConflict(
            f"key {self.intent.key} (step {self.intent.step!r} of {self.intent.workflow_id})"
            f" already ran {self.intent.tool} with args hash {recorded_hash}; "
            f"this call has {self.intent.args_hash}. Nothing was executed. Use another "
            "key= for a different call.",
            **self.fields(recorded_hash=recorded_hash),
        )

    async def _by_record(self, view: RecordView) -> Any:
        state = view.state
        if not self.same_call(state.intent.args_hash):
            raise self._conflict(state.intent.args_hash)
        if state.final:
            return self.recorded(view)
        if state.phase == "idle" or (
            state.phase == "calling"
            and state.owner == self.owner
            and self.previous_phase != "calling"
        ):
            # never called: released after a definite failure, or our own earlier attempt
            # died between claiming the record and its pre-call heartbeat
            if state.phase == "idle":
                await self.mark("calling")
            return await self._call()
        return await self._maybe_called(view)

    async def _maybe_called(self, view: RecordView, why: str = "") -> Any:
        """The tool may have run already (this chain or another)."""
        if self._may_recall(view):
            self.log.info("tool.recall_same_key", reason="provider-idempotent")
            await self.mark("calling")
            return await self._call(maybe_called=True)
        if view.state.phase != "unknown" and view.state.owner != self.owner:
            # another run's attempt (a reset or a re-run) may still be paying: give it the
            # heartbeat timeout to record its result. An earlier attempt of this same activity
            # gets none: Temporal started this attempt because that one stopped heartbeating,
            # so it is all but surely dead (SIGKILL, OOM: one that is alive and can reach the
            # server keeps heartbeating). One that was only stalled and finishes later leaves
            # its result on the record, and the call, unknown meanwhile, is reconciled: never
            # re-sent. So a crash settles within about heartbeat_timeout + 2 s.
            grace = self.tool.options.heartbeat_timeout
            async with self.keepalive({"phase": "calling", "attempt": self.info.attempt}):
                waited = await self.record.wait_done(grace)
            if waited is not None and waited.state.final:
                return self.recorded(waited)
        reason = (
            "an earlier attempt may have called the tool and did not record a result "
            f"(it crashed or timed out; record phase {view.state.phase!r})"
        )
        if why:
            reason = (
                "an attempt of the run that first made this call may have called the tool "
                f"and did not record a result ({why})"
            )
        await self.unknown(reason)
        raise AmbiguousOutcome(
            f"{self.intent.tool} {self.intent.step}: outcome unknown; not re-sent. {reason}",
            **self.fields(reason=reason),
        )

    def _may_recall(self, view: RecordView) -> bool:
        window = self.tool.options.provider_idempotent
        if window is False:
            return False
        if isinstance(window, timedelta):
            return datetime.now(UTC) - view.since < window
        return True

    def recorded(self, view: RecordView) -> Any:
        state = view.state
        self.deduplicated = True
        if state.phase == "abandoned":
            raise CallAbandoned(
                f"{self.intent.tool} {self.intent.step}: its outcome was unknown and a person "
                f"abandoned it ({state.reason}); it is not run again under this key",
                **self.fields(),
            )
        if state.unserializable is not None:
            raise ResultNotSerializable(
                f"{self.intent.tool} {self.intent.step} ran, but its result could not be "
                f"recorded: {state.unserializable}",
                **self.fields(),
            )
        self.log.info("tool.deduplicated", recorded_by=state.owner.run_id)
        return state.result

    # -- calling ----------------------------------------------------------------------------
    async def _claim_and_beat(self) -> bool:
        """Claim the record and write the pre-call heartbeat in parallel (one round trip).

        The tool is called only if both succeeded; if the key is already claimed, the
        heartbeat says "calling" for a call that did not happen, which can only make a later
        attempt more careful (AmbiguousOutcome), never make it call twice.
        """
        if self.previous_phase == "calling":  # keep what the earlier attempt wrote
            return False
        if self.beaten:  # the pre-call heartbeat went with the run's claim
            self.claimed = await durably(
                self.record.claim(self.owner, self.info.attempt), self.cancel.by_worker
            )
            return self.claimed
        both = asyncio.gather(
            self.record.claim(self.owner, self.info.attempt),
            # to the server only: the keepalive beats through the worker while the tool runs,
            # well within the heartbeat timeout, so this saves a request per call
            self.beat({"phase": "calling", "attempt": self.info.attempt}, via_worker=False),
        )
        claimed, _ = await durably(both, self.cancel.by_worker)  # a claim is never torn
        self.claimed = bool(claimed)
        return self.claimed

    async def _call(self, beat: bool = True, maybe_called: bool = False) -> Any:
        if beat:
            await self.beat({"phase": "calling", "attempt": self.info.attempt}, via_worker=False)
        if self.cancel.why:
            return await self.cancel.before_call(maybe_called)
        maybe_crash("in_call", self.intent.tool, self.info.attempt, self.intent.step)
        try:
            result = await self._invoke(beat_phase="calling")
        except Exception as exc:
            return await self._failed(exc)
        maybe_crash("after_call", self.intent.tool, self.info.attempt, self.intent.step)
        try:
            value = to_json_value(result, f"{self.intent.tool}() result")
        except InvalidCall as exc:
            await self._done(None, unserializable=exc.message)
            raise ResultNotSerializable(
                f"{self.intent.tool} {self.intent.step} ran (recorded as done, it will not run "
                f"again under this key), but its result cannot be recorded: {exc.message}. "
                "Return JSON data, a pydantic model or a dataclass.",
                **self.fields(),
            ) from None
        reported = self.claimed and not self.cancel.why and await self._report(value)
        if not reported:
            await self._done(value)
            # late (its claim lost, or its completion refused): the call may be parked
            if self.claim.lost is not None or (self.claimed and not self.cancel.why):
                await self._tell_a_parked_reconciliation(value)
        maybe_crash("after_record", self.intent.tool, self.info.attempt, self.intent.step)
        self.log.info("tool.executed")
        return REPORTED if reported else value

    async def _report(self, value: Any) -> bool:
        """Complete this activity with the call's result, by its task token: the completion
        is the call's done marker (in the owner run's history). False if the server refused
        it (the run was reset or closed, or this attempt timed out): the record keeps it."""
        try:
            await durably(self.handle.complete(value), self.cancel.by_worker)
        except Exception as exc:
            self.log.warning("tool.completion_refused", error=_describe(exc))
            return False
        return True

    async def _invoke(self, beat_phase: str) -> Any:
        t = self.tool
        pos, kw = t.arguments_for_call(self.intent.args)
        if t.takes_key:
            kw["idempotency_key"] = self.intent.key
        if beat_phase != "read_only":
            i = self.intent
            note_execution(i.tool, i.step, i.key, self.info.attempt, i.workflow_id)
        self.claim.loop = asyncio.get_running_loop()
        self.claim.check = lambda: self.handle.heartbeat(
            {"phase": beat_phase, "attempt": self.info.attempt}
        )
        # the tool's task (or thread) copies this context
        with running(self.intent), holding(self.claim):
            if t.is_async:
                run = asyncio.ensure_future(t.fn(*pos, **kw))
            else:
                run = asyncio.ensure_future(asyncio.to_thread(t.fn, *pos, **kw))
        async with self.keepalive({"phase": beat_phase, "attempt": self.info.attempt}):
            return await self.cancel.outcome(run)

    async def _failed(self, exc: Exception) -> Any:
        opts = self.tool.options
        if isinstance(exc, (NotExecuted, *opts.not_executed_on)):
            await self.mark("released", reason=_describe(exc))
            await self.beat({"phase": "released", "attempt": self.info.attempt})
            final = self._final_attempt(exc) or self.cancel.by_workflow
            self.log.info("tool.not_executed", error=_describe(exc), final=final)
            raise ApplicationError(
                _describe(exc),
                {"error_type": type(exc).__name__, "attempt": self.info.attempt},
                type=NotExecuted.code,
                non_retryable=final,
                next_retry_delay=self._backoff(),
            ) from exc
        retried = not self.cancel.by_workflow  # a cancelled call is not retried
        if opts.provider_idempotent is not False and retried and not self._final_attempt(exc):
            # the provider dedupes on the key: the next attempt re-calls with the same key
            self.log.warning("tool.error_retry_same_key", error=_describe(exc))
            if self.fast:
                # off the happy path, the fast path writes the record too: a cancel in the
                # back-off leaves no trace of this attempt in the history
                await self.mark("calling")
            raise ApplicationError(
                _describe(exc), type="ToolError", next_retry_delay=self._backoff()
            ) from exc
        reason = f"the tool raised {_describe(exc)} after it may have started its effect"
        if self.cancel.why and not isinstance(exc, ToolCancelled):
            reason = f"{reason} ({self.cancel.why})"
        await self.unknown(reason)
        raise AmbiguousOutcome(
            f"{self.intent.tool} {self.intent.step}: outcome unknown; not re-sent. {reason}. "
            "Raise exactcall.NotExecuted (or list the type in not_executed_on=) when an error "
            "means the effect did not happen.",
            **self.fields(reason=reason, error_type=type(exc).__name__),
        ) from exc

    def _backoff(self) -> timedelta:
        """The tool's own retry policy, for a definite failure: the activity's policy starts
        retrying quickly, so that the attempt after a crash settles the call at once."""
        p = self.tool.options.retry_policy
        delay = p.initial_interval.total_seconds() * p.backoff_coefficient ** max(
            0, self.info.attempt - 1
        )
        cap = p.maximum_interval.total_seconds() if p.maximum_interval else delay
        return timedelta(seconds=min(delay, cap))

    def _final_attempt(self, exc: Exception) -> bool:
        policy = self.tool.options.retry_policy
        if isinstance(exc, NotExecuted) and exc.non_retryable:
            return True
        if type(exc).__name__ in (policy.non_retryable_error_types or ()):
            return True
        return 0 < policy.maximum_attempts <= self.info.attempt

    # -- markers ----------------------------------------------------------------------------
    async def beat(
        self, details: dict[str, Any], durable: bool = True, via_worker: bool = True
    ) -> None:
        """A synchronous heartbeat: durable, and refused if this attempt is stale. Its answer
        may say that the workflow cancelled the call (the heartbeat is recorded all the same).

        ``via_worker``: the same details go to the worker's own (throttled, so possibly late)
        heartbeat too, which the worker needs to keep the attempt (it times out attempts that
        do not heartbeat through it). Only for details that a late arrival cannot make less
        careful: "calling" and what follows it, never an earlier attempt's details while
        deciding. ``durable``: finished even if the attempt is cancelled meanwhile (not for
        the liveness loop, which is cancelled when its work is done)."""
        if via_worker:
            activity.heartbeat(details)
        sent = clock()
        beat = self.handle.heartbeat(details)
        try:
            await (durably(beat, self.cancel.by_worker) if durable else beat)
        except AsyncActivityCancelledError as exc:
            if exc.details is not None and not exc.details.cancel_requested:
                raise  # paused or reset by an operator: as before, this attempt ends
            self.claim.acked(sent)  # recorded all the same
            self.cancel(BY_WORKFLOW)
        else:
            self.claim.acked(sent)

    @contextlib.asynccontextmanager
    async def keepalive(
        self, details: dict[str, Any], via_worker: bool = True
    ) -> AsyncIterator[None]:
        interval = max(0.2, self.tool.options.heartbeat_timeout.total_seconds() / 4)

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.beat(details, durable=False, via_worker=via_worker)
                except Exception as exc:  # stale attempt or server away: keep the tool going
                    self.log.warning("tool.heartbeat_failed", error=_describe(exc))

        async def watch() -> None:
            """The claim's deadline, checked between heartbeats: a worker cut off from the
            server gives it up on time; a frozen one at once when it runs again (its timers
            are overdue, and this one is due before any the tool set for later)."""
            while not self.claim.expired():
                await asyncio.sleep(max(0.0, min(interval / 2, self.claim.expires_at - clock())))
            self.cancel.claim_lost(self.claim.lost or "")

        tasks = [asyncio.create_task(loop()), asyncio.create_task(watch())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def mark(self, kind: str, **fields: Any) -> None:
        ev = RecordEvent(kind=kind, owner=self.owner, attempt=self.info.attempt, **fields)  # type: ignore[arg-type]
        await durably(self.record.mark(ev), self.cancel.by_worker)

    async def _done(self, value: Any, unserializable: str | None = None) -> None:
        try:
            await self.mark("done", result=value, unserializable=unserializable)
        except Exception:
            # keep the result in this chain's heartbeat so the next attempt can record it
            await self.beat({"phase": "done", "result": value, "unserializable": unserializable})
            raise

    async def _tell_a_parked_reconciliation(self, value: Any) -> None:
        """This attempt made the call after all, late (its claim was lost, or the server
        refused its completion): a reconciliation that parked the call for a person meanwhile
        settles it as landed with this result. The reconciliation takes it only while parked;
        most late attempts have none (the next attempt then finds the result recorded). A
        tool with a probe needs none: its reconciliation asks the probe once this attempt
        can no longer act."""
        if self.in_reconciliation or self.tool.options.reconcile is not None:
            return
        handle = activity.client().get_workflow_handle(reconcile_id(self.intent.key))
        why = f"attempt {self.info.attempt} made the call after its outcome was unknown"
        for _ in range(LATE_TRIES):
            res = Resolution(
                verdict="landed",
                result=value,
                by=LATE_ATTEMPT,
                reason=why,
                resolution_id=uuid.uuid4().hex,
            )
            try:
                await durably(handle.signal(RESOLVE_SIGNAL, res), self.cancel.by_worker)
                await asyncio.sleep(0.5)
                st = await handle.query(STATE_QUERY, result_type=ReconcileState)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    self.log.info("tool.late_result_not_told", error=_describe(exc))
                    return
                # none yet: a successor that read the record before this result was on it
                # may be starting one now
                await asyncio.sleep(0.5)
                continue
            if st.phase != "probing":  # it took it, or was settled otherwise
                self.log.info("tool.late_result_told", phase=st.phase)
                return
        self.log.info("tool.late_result_not_told", error="no parked reconciliation")

    async def _finish_recording(self) -> Any:
        """The previous attempt ran the tool but could not write the record: write it now."""
        details = self.info.heartbeat_details[0]
        await self.mark(
            "done", result=details.get("result"), unserializable=details.get("unserializable")
        )
        return self.recorded(await self._must_read())

    async def unknown(self, reason: str) -> None:
        self.log.error("tool.ambiguous", reason=reason)
        try:
            await self.mark("unknown", reason=reason)
        except Exception as exc:
            self.log.error("tool.record_unreachable", error=_describe(exc))
        await self._route(reason)

    async def _route(self, reason: str) -> None:
        """Start the call's reconciliation now: the call is routed as soon as its outcome is
        known to be unknown, not at the calling workflow's next task (which may wait out a
        dead worker's sticky queue first). The workflow then finds it running and joins it;
        if this start fails, the workflow starts it (as before)."""
        if self.info.workflow_id == reconcile_id(self.intent.key):
            return  # a re-run inside the reconciliation itself
        inp = reconcile_input(self.tool, self.intent, reason, datetime.now(UTC))
        options = reconcile_start_options(inp, cancelled=self.cancel.by_workflow or self.settling)
        start = activity.client().start_workflow(RECONCILE_WORKFLOW, inp, **options)
        try:
            await durably(start, self.cancel.by_worker)
        except WorkflowAlreadyStartedError:
            pass  # an earlier attempt or run started it
        except Exception as exc:
            self.log.warning("tool.reconcile_start_deferred", error=_describe(exc))

    async def _must_read(self) -> RecordView:
        view = await self.record.read(claimant=False)
        if view is None:
            raise ExactcallError(f"the record of key {self.intent.key} cannot be read")
        return view

    # -- guards -----------------------------------------------------------------------------
    def _check_intent(self) -> None:
        """Recompute the hash and the key of the intent about to run; refuse on mismatch."""
        i = self.intent
        expect_hash = args_hash(i.tool, i.args)
        expect_key = derive_key(self.info.namespace, i.workflow_id, i.step, i.tool, i.tool_version)
        # a call runs in its own workflow, or in the reconciliation of its key (an undo also
        # in the undo workflow of its workflow id: exactcall undo)
        foreign = self.info.workflow_id not in (i.workflow_id, reconcile_id(i.key))
        foreign = foreign and not self.in_undo_run
        if foreign or i.tool != self.tool.name or (expect_hash, expect_key) != (i.args_hash, i.key):
            raise InvalidCall(
                "the intent handed to this activity does not match its own arguments "
                "(edited history or a bug); nothing was executed",
                **self.fields(expected_hash=expect_hash, expected_key=expect_key),
            )
        self._check_approval(expect_hash)

    def _check_approval(self, actual_hash: str) -> None:
        """The hash about to run must be the approved hash, if the call needs approval."""
        i = self.intent
        if i.approval is None and not self.tool.needs_approval(i):
            return
        if i.approval is None or i.approval.args_hash != actual_hash:
            approved = i.approval.args_hash if i.approval else None
            self.log.error("approval.mismatch_at_effect", approved_hash=approved)
            raise ApprovalMissing(
                f"{i.tool} {i.step} is about to run args hash {actual_hash}, but the approved "
                f"hash is {approved}; refusing to run it",
                **self.fields(approved_hash=approved),
            )

    def fields(self, **extra: Any) -> dict[str, Any]:
        i = self.intent
        return {
            "tool": i.tool,
            "step": i.step,
            "key": i.key,
            "workflow_id": i.workflow_id,
            "args_hash": i.args_hash,
            **extra,
        }


def _describe(exc: BaseException) -> str:
    msg = exc.message if isinstance(exc, ApplicationError) else str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
