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

What the attempt does is decided by the table in ``_decision`` (pure); this module learns what
the table asks for (the run's claim, the claimant's calls, the record) and carries the decision
out; ``_calling`` makes the call, ``_markers`` writes the markers.

Cancellation (see ``_cancelling``): cancelled before the tool was called, the key is released
(NotExecuted); afterwards the tool is told and decides: it returns (done), raises NotExecuted
(released), or anything else (unknown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from exactcall._crash import maybe_crash
from exactcall._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    NotExecuted,
    ResultNotSerializable,
)
from exactcall._metrics import observed_attempt
from exactcall._model import Intent, WireIntent
from exactcall._tool import Tool
from exactcall.activities import _runs as runs
from exactcall.activities._calling import REPORTED, ToolCall
from exactcall.activities._cancelling import durably
from exactcall.activities._decision import (
    ABSENT,
    LEARN,
    Absent,
    Claimant,
    Decision,
    Do,
    Facts,
    Holder,
    Place,
    Seen,
    Source,
    decide,
)
from exactcall.activities._guards import check_intent
from exactcall.activities._markers import Markers
from exactcall.activities._records import RecordView
from exactcall.reconciliation._verdicts import CallAbandoned
from exactcall.undo._undo import is_undo_step

__all__ = ["tool_activity"]


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
    """One attempt of one call: it learns what the decision table asks for, and carries out
    what it decides."""

    markers_type: type[Markers] = Markers
    deduplicated = False
    """The record already had the call's result (for the outcome metric and span)."""
    beaten = False
    """This attempt's pre-call heartbeat ("calling") is written."""

    def __init__(
        self, t: Tool, intent: Intent, *, run_claims: bool = True, fail_stop: bool = True
    ) -> None:
        self.run_claims = run_claims
        self.tool = t
        self.markers = self.markers_type(t, intent, fail_stop=fail_stop)
        self.log = self.markers.log
        self._holder = ""
        self._claimant: runs.ClaimantCall | None = None
        self._view: RecordView | None = None
        self._waited: RecordView | None = None

    @property
    def intent(self) -> Intent:
        return self.markers.intent

    @property
    def info(self) -> activity.Info:
        return self.markers.info

    @property
    def previous_phase(self) -> str | None:
        return self.markers.previous_phase

    def _check_intent(self) -> None:
        check_intent(self.markers)

    async def run(self) -> Any:
        self._check_intent()
        m = self.markers
        if self.tool.attempt_reads:
            if m.settling:  # a cancelled read (by a trusted MCP hint): nothing to settle
                raise NotExecuted(f"{self.tool.name} is read-only here: it changed nothing")
            return await self.tool_call(Decision(Do.CALL)).read()
        if not m.settling:
            maybe_crash("before_claim", self.intent.tool, self.info.attempt, self.intent.step)
        facts = self.facts()
        while True:
            d = decide(facts)
            if d.do in LEARN:
                facts = replace(await self._learn(d, facts), now=datetime.now(UTC))
            elif d.do is Do.CALL and facts.cancelled is None:
                await self._before_call(d)
                facts = replace(facts, cancelled=m.cancel.why or "")
            else:
                return await self._carry_out(d)

    def facts(self) -> Facts:
        """What this attempt knows before any request."""
        i, window = self.intent, self.tool.options.provider_idempotent
        place = Place.CALLER
        if self.markers.in_reconciliation:
            place = Place.RECONCILIATION
        elif self.markers.in_undo_run:
            place = Place.UNDO_RUN
        return Facts(
            previous_phase=self.previous_phase,
            attempt=self.info.attempt,
            place=place,
            settling=self.markers.settling,
            run_claims=self.run_claims,
            # a provider-idempotent tool on the fast path writes nothing before the call: an
            # attempt that follows one that may have called re-sends it with the same key
            # anyway (inside the provider's window), which is all a pre-call heartbeat would
            # tell it
            beat_free=self.run_claims and window is not False,
            undo_step=is_undo_step(i.step),
            window=window,
            scheduled_at=self.info.scheduled_time,
            now=datetime.now(UTC),
        )

    # -- learning ---------------------------------------------------------------------------
    async def _learn(self, d: Decision, f: Facts) -> Facts:
        """What ``d`` asks for, added to ``f``."""
        m, client = self.markers, activity.client()
        if d.do is Do.CLAIM_RUN:
            if not self.run_claims:  # per-call records; the run's claim names no run
                await runs.claimant(client, self.intent, m.owner.run_id, fast=False)
                return replace(f, holder=Holder.NONE)
            self._holder = await self._claim_run(beat=d.beat)
            return replace(f, holder=self._holder_is(self._holder), beaten=self.beaten)
        if d.do is Do.ASK_HOLDER:
            self._holder = await runs.holder(client, self.intent.workflow_id) or ""
            return replace(f, holder=Holder.OTHER if self._holder else Holder.NONE)
        if d.do is Do.ASK_CLAIMANT:
            return replace(f, claimant=await self._ask_claimant())
        if d.do is Do.CLAIM_RECORD:
            return replace(f, record_claimed=await self._claim_and_beat())
        if d.do is Do.READ_RECORD:
            return replace(f, record=self._seen(await m.read()))
        if d.do is Do.RECLAIM:
            return replace(f, reclaimed=await m.record.claim(m.owner, self.info.attempt))
        if d.do is Do.READ_AGAIN:
            return replace(f, record=self._seen(await m.must_read()))
        if d.do is Do.WAIT_DONE:
            async with m.keepalive(m.calling()):
                self._waited = await m.record.wait_done(self.tool.options.heartbeat_timeout)
            return replace(f, waited=self._waited is not None and self._waited.state.final)
        assert d.do is Do.CHAIN_DOUBT, d
        return replace(f, chain_doubt=await self.own_chain_doubt())

    def _holder_is(self, holder: str) -> Holder:
        if holder == self.markers.owner.run_id:
            return Holder.MINE
        return Holder.OTHER if holder else Holder.NONE

    async def _claim_run(self, beat: bool) -> str:
        """Who holds the run claim of the call's workflow id (claimed for this run if
        nobody does); with ``beat``, the pre-call heartbeat is written at the same time."""
        m = self.markers
        claim = runs.claimant(activity.client(), self.intent, m.owner.run_id)
        if not beat:
            return await durably(claim, m.cancel.by_worker)
        both = asyncio.gather(claim, m.beat(m.calling(), via_worker=False))
        holder, _ = await durably(both, m.cancel.by_worker)
        self.beaten = True
        return holder

    async def _ask_claimant(self) -> Claimant:
        """What the claimant run (closed, unless this attempt is stale) did about the key."""
        i = self.intent
        seen = await runs.claimant_call(activity.client(), i.workflow_id, self._holder, i.key)
        self._claimant = seen
        recorded = seen.args_hash
        same = seen.status not in ("done", "in_doubt") or recorded is None
        return Claimant(
            status=seen.status,
            same_call=same or self.same_call(str(recorded)),
            since=seen.scheduled_at or self.info.scheduled_time,
            why=seen.why,
        )

    async def _claim_and_beat(self) -> bool:
        """Claim the record and write the pre-call heartbeat in parallel (one round trip).

        The tool is called only if both succeeded; if the key is already claimed, the
        heartbeat says "calling" for a call that did not happen, which can only make a later
        attempt more careful (AmbiguousOutcome), never make it call twice.
        """
        m = self.markers
        if self.beaten:  # the pre-call heartbeat went with the run's claim
            return await durably(m.record.claim(m.owner, self.info.attempt), m.cancel.by_worker)
        both = asyncio.gather(
            m.record.claim(m.owner, self.info.attempt),
            # to the server only: the keepalive beats through the worker while the tool runs,
            # well within the heartbeat timeout, so this saves a request per call
            m.beat(m.calling(), via_worker=False),
        )
        claimed, _ = await durably(both, m.cancel.by_worker)  # a claim is never torn
        return bool(claimed)

    def _seen(self, view: RecordView | None) -> Seen | Absent:
        self._view = view
        if view is None:
            return ABSENT
        state = view.state
        return Seen(
            phase=state.phase,
            mine=state.owner == self.markers.owner,
            same_call=self.same_call(state.intent.args_hash),
            since=view.since,
        )

    async def own_chain_doubt(self) -> str:
        """For the settling attempt of a cancelled chain that left no record: why that chain
        may have called the tool, when this run holds the claim ("" when it cannot have, or
        when the run used per-call records, whose absence then says it was never called)."""
        if self.markers.in_reconciliation or self.markers.in_undo_run or not self.run_claims:
            return ""
        client, owner = activity.client(), self.markers.owner
        holder = await runs.claimant(client, self.intent, owner.run_id)
        if holder != owner.run_id:
            return ""
        chains = await runs.run_chains(client, self.intent.workflow_id, owner.run_id)
        mine = [c for c in chains.get(self.intent.key, []) if c.activity_id == owner.activity_id]
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

    # -- carrying out -----------------------------------------------------------------------
    async def _before_call(self, d: Decision) -> None:
        """The pre-call markers the decision names."""
        m = self.markers
        if d.again:
            self.log.info("tool.recall_same_key", reason="provider-idempotent")
        if d.mark:
            await m.mark("calling")
        if d.beat:
            await m.beat(m.calling(), via_worker=False)

    def tool_call(self, d: Decision) -> ToolCall:
        return ToolCall(self.markers, owns=d.owns, fast=d.fast)

    async def _carry_out(self, d: Decision) -> Any:
        m, i = self.markers, self.intent
        if d.do is Do.CALL:
            return await self.tool_call(d).run()
        if d.do is Do.FINISH:
            return await self._finish_recording()
        if d.do is Do.RECORDED:
            if d.source is Source.CLAIMANT:
                assert self._claimant is not None
                self.deduplicated = True
                self.log.info("tool.deduplicated", recorded_by=self._holder)
                return self._claimant.result
            view = self._waited if d.source is Source.WAITED else self._view
            assert view is not None
            return self.recorded(view)
        if d.do is Do.CONFLICT:
            if d.source is Source.CLAIMANT:
                assert self._claimant is not None
                raise self._conflict(str(self._claimant.args_hash))
            assert self._view is not None
            raise self._conflict(self._view.state.intent.args_hash)
        if d.do is Do.UNKNOWN:
            await m.unknown(d.reason)
            raise AmbiguousOutcome(
                f"{i.tool} {i.step}: outcome unknown; not re-sent. {d.reason}",
                **m.fields(reason=d.reason),
            )
        if d.do is Do.STALE:
            raise ApplicationError(
                f"{i.tool} {i.step}: this attempt's run has closed and another run of the "
                "workflow id holds its calls; nothing was executed",
                {"error_type": "StaleAttempt", "attempt": self.info.attempt},
                type=NotExecuted.code,
                non_retryable=True,
            )
        if d.do is Do.NOT_CALLED:  # the settling attempt
            raise ApplicationError(
                f"{i.tool} {i.step} was cancelled before it was called; {d.reason}",
                {"error_type": "Cancelled", "attempt": self.info.attempt},
                type=NotExecuted.code,
                non_retryable=True,
            )
        assert d.do is Do.RELEASE, d  # cancelled after the markers, before the call
        await m.mark("released", reason=d.reason)
        await m.beat({"phase": "released", "attempt": self.info.attempt})
        self.log.info("tool.cancelled_before_call", why=m.cancel.why)
        raise ApplicationError(
            d.reason,
            {"error_type": "Cancelled", "attempt": self.info.attempt},
            type=NotExecuted.code,
            non_retryable=m.cancel.by_workflow,
        )

    def _conflict(self, recorded_hash: str) -> IntentConflict:
        self.log.warning("tool.conflict", recorded_hash=recorded_hash)
        return IntentConflict(
            f"key {self.intent.key} (step {self.intent.step!r} of {self.intent.workflow_id})"
            f" already ran {self.intent.tool} with args hash {recorded_hash}; "
            f"this call has {self.intent.args_hash}. Nothing was executed. Use another "
            "key= for a different call.",
            **self.markers.fields(recorded_hash=recorded_hash),
        )

    def recorded(self, view: RecordView) -> Any:
        state = view.state
        self.deduplicated = True
        if state.phase == "abandoned":
            raise CallAbandoned(
                f"{self.intent.tool} {self.intent.step}: its outcome was unknown and a person "
                f"abandoned it ({state.reason}); it is not run again under this key",
                **self.markers.fields(),
            )
        if state.unserializable is not None:
            raise ResultNotSerializable(
                f"{self.intent.tool} {self.intent.step} ran, but its result could not be "
                f"recorded: {state.unserializable}",
                **self.markers.fields(),
            )
        self.log.info("tool.deduplicated", recorded_by=state.owner.run_id)
        return state.result

    async def _finish_recording(self) -> Any:
        """The previous attempt ran the tool but could not write the record: write it now."""
        details = self.info.heartbeat_details[0]
        await self.markers.mark(
            "done", result=details.get("result"), unserializable=details.get("unserializable")
        )
        return self.recorded(await self.markers.must_read())
