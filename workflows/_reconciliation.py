"""The reconciliation of one call whose outcome is unknown (workflow id derived from the key).

A probe asks the destination; if it cannot tell (or there is none, or its deadline passes) the
call is parked until a person resolves it. ``landed`` completes the call with a result;
``not_landed`` lets it run once more with the same key (a probe may order that once; a person
as often as they decide); ``abandon`` ends it with CallAbandoned. Every verdict is recorded on
the call's record, in this workflow's memo and by query. It outlives the workflow of its call;
when that workflow cancelled the call, ``not_landed`` releases the key instead of re-running.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from exactcall._errors import AmbiguousOutcome, ToolFailed, UnknownTool
from exactcall._metrics import reconciliation_parked, reconciliation_verdict
from exactcall._model import Owner, RecordEvent
from exactcall._tool import get_tool
from exactcall._ui import parked_details
from exactcall._wire import (
    BUDGETS_PATCH,
    RECONCILE_DECIDES_AT_START,
    RECONCILE_OUTWAITS_THE_CLAIM,
)
from exactcall._wire import MARKS_BY_ACTIVITY as MARKS_BY_ACTIVITY
from exactcall._wire import PROBE_PREFIX as PROBE_PREFIX
from exactcall._wire import TELLS_THE_CALL as TELLS_THE_CALL
from exactcall._wire import probe_activity_name as probe_activity_name
from exactcall.reconciliation._verdicts import (
    JOINED_SIGNAL,
    RECONCILE_STATE_QUERY,
    RECONCILE_WORKFLOW,
    RESOLVE_SIGNAL,
    SETTLED_SIGNAL,
    UNRESOLVED_ATTRIBUTE,
    UNRESOLVED_MEMO,
    VERDICT_MEMO,
    CallSpec,
    ReconcileInput,
    ReconcileState,
    Resolution,
    Settled,
    SettledNote,
    UnresolvedCall,
    Verdict,
)
from exactcall.workflows._budget_calls import settle_intent, settle_ops
from exactcall.workflows._record import MARK_RECORD, mark_from_workflow
from exactcall.workflows._schedule import execute_call_activity
from exactcall.workflows._state import pinned_search_attributes
from exactcall.workflows._unknown import (
    CANCELLED_ERROR,
    CANCELLED_MEMO,
    CANCELLED_SIGNAL,
    call_spec,
)

__all__ = ["PROBE_PREFIX", "Reconcile", "probe_activity_name"]

UNRESOLVED_KEY = SearchAttributeKey.for_bool(UNRESOLVED_ATTRIBUTE)
MAX_PROBE_RERUNS = 1
CLAIM_SLACK = timedelta(seconds=1)
"""Past a heartbeat timeout after the reconciliation started: room for the old attempt's
worker to carry out the loss of its claim (cancel the tool, or stop itself), and for clocks."""


@workflow.defn(name=RECONCILE_WORKFLOW)
class Reconcile:
    def __init__(self) -> None:
        self._phase = "probing"
        self._reason = ""
        self._history: list[str] = []
        self._resolutions: list[tuple[Resolution, str]] = []
        self._waiting: Resolution | None = None
        self._settler_reason: str | None = None
        """The reason the person gave with the verdict that settled the call (for the audit)."""
        self._parked = False
        self._settled: Settled | None = None
        self._call_cancelled = False
        self._input: ReconcileInput | None = None
        self._decided_at_start = False
        self._outwaits_the_claim = False

    @workflow.run
    async def run(self, inp: ReconcileInput) -> Settled:
        # before any await: the first workflow task, where replay always finds the marker
        self._decided_at_start = workflow.patched(RECONCILE_DECIDES_AT_START)
        self._outwaits_the_claim = workflow.patched(RECONCILE_OUTWAITS_THE_CLAIM)
        if self._decided_at_start:
            pinned_search_attributes()
        call = self._call_spec(inp)
        self._reason = inp.reason
        self._input = inp
        if workflow.memo_value(CANCELLED_MEMO, False, type_hint=bool):
            self._call_cancelled = True
        probe_reruns = 0
        reruns = 0
        while True:
            verdict, by, why = await self._verdict(inp, probe_reruns < MAX_PROBE_RERUNS)
            reconciliation_verdict(inp.intent.tool, verdict, by)
            if verdict == "landed":
                return await self._finish(
                    inp,
                    Settled(
                        outcome="done", verdict="landed", decided_by=by, result=why, reason=None
                    ),
                )
            if verdict == "abandon":
                return await self._finish(
                    inp, Settled(outcome="abandoned", verdict="abandon", decided_by=by, reason=why)
                )
            if self._call_cancelled:
                return await self._release_cancelled(inp, by)
            probe_reruns += by == "probe"
            reruns += 1
            await self._mark(inp, "not_landed", reason=f"not landed, decided by {by}")
            self._phase = "re-running"
            self._note(f"re-running with the same key (decided by {by})")
            try:
                result = await execute_call_activity(call, inp.intent, f"rerun-{reruns}")
            except ToolFailed as err:
                return await self._finish(
                    inp,
                    Settled(
                        outcome="failed",
                        verdict="not_landed",
                        decided_by=by,
                        reason=err.message,
                        error_type=str(err.fields.get("error_type") or "ToolFailed"),
                    ),
                    marked=True,
                )
            except AmbiguousOutcome as err:
                self._reason = f"the re-run is of unknown outcome too: {err.message}"
                self._note(self._reason)
                continue
            return await self._finish(
                inp,
                Settled(outcome="done", verdict="not_landed", decided_by=by, result=result),
                marked=True,
            )

    # -- verdicts ---------------------------------------------------------------------------
    async def _verdict(self, inp: ReconcileInput, may_probe: bool) -> tuple[str, str, Any]:
        """(landed | not_landed | abandon, who decided, result-or-reason)."""
        if inp.has_probe:
            asked_at = workflow.now()
            v = await self._probe(inp)
            if v is not None and v.kind == "not_landed" and may_probe:
                v = await self._ask_again_once_the_claim_is_gone(inp, asked_at, v)
            if v is not None and (v.kind == "landed" or (v.kind == "not_landed" and may_probe)):
                self._note(f"probe: {v.kind}")
                return v.kind, "probe", v.result
            if v is not None:
                self._reason = v.reason or (
                    "the probe said not landed again after a re-run"
                    if v.kind == "not_landed"
                    else "the probe could not tell"
                )
        elif not self._history:
            self._reason = f"{self._reason} (no probe declared)"
        return await self._park(inp)

    async def _ask_again_once_the_claim_is_gone(
        self, inp: ReconcileInput, asked_at: datetime, v: Verdict
    ) -> Verdict | None:
        """A "not landed" is true only of the moment the probe looked: an attempt that lost
        its claim but still runs (a frozen or cut-off worker) may make the effect later. Such
        an attempt gives its claim up no later than the server hands the call on, which was
        before this reconciliation started; it then cancels its tool or stops its process
        within a fraction of a heartbeat timeout. So: wait until a heartbeat timeout (and
        CLAIM_SLACK) after the start, and ask the probe again; re-run only if it still says
        not landed. A tool whose provider may commit a request after the tool gave up on it
        (``late_commit``) adds that much to the wait."""
        if not self._outwaits_the_claim:
            return v
        spec = self._call_spec(inp)
        # late_commit only from the input: a reconciliation of a version that carried no spec
        # must wait as it did, whatever the tool declares now (the same commands on replay)
        late = inp.call.late_commit if inp.call is not None else timedelta(0)
        gone_at = workflow.info().start_time + spec.heartbeat_timeout + CLAIM_SLACK + late
        if asked_at >= gone_at:
            return v
        wait = gone_at - workflow.now()
        self._note(
            f"probe: not_landed; asking again once the attempt that may still be making the "
            f"call has lost its claim to run ({max(wait.total_seconds(), 0):.1f}s)"
        )
        if wait > timedelta(0):
            await workflow.sleep(wait, summary="outwait the earlier attempt's claim")
        return await self._probe(inp)

    @staticmethod
    def _call_spec(inp: ReconcileInput) -> CallSpec:
        """How the call's activity is scheduled: from the input (reconciliations started
        before it was carried there look the tool up in this worker's registry)."""
        if inp.call is not None:
            return inp.call
        return call_spec(get_tool(inp.intent.tool))

    async def _probe(self, inp: ReconcileInput) -> Verdict | None:
        self._phase = "probing"
        deadline = inp.probe_deadline
        heartbeat = self._call_spec(inp).heartbeat_timeout
        try:
            return await workflow.execute_activity(
                probe_activity_name(inp.intent.tool),
                inp.intent,
                result_type=Verdict,
                schedule_to_close_timeout=deadline,
                start_to_close_timeout=min(deadline, timedelta(minutes=1)),
                heartbeat_timeout=heartbeat,
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
                summary=f"probe {inp.intent.tool} {inp.intent.step}",
            )
        except ActivityError as err:
            self._reason = f"the probe failed or passed its deadline: {err.cause or err}"
            self._note(self._reason)
            return None

    async def _park(self, inp: ReconcileInput) -> tuple[str, str, Any]:
        self._phase = "parked"
        self._note(f"parked: {self._reason}")
        self._publish(inp, parked=True)
        reconciliation_parked(inp.intent.tool, inp.has_probe)
        await workflow.wait_condition(lambda: self._waiting is not None)
        res, self._waiting = self._waiting, None
        self._settler_reason = res.reason if res is not None else None
        if res is None:  # cannot happen: the condition above; fail the workflow, not its task
            raise ApplicationError(
                "exactcall.Reconcile: woke without a resolution", non_retryable=True
            )
        self._publish(inp, parked=False)
        self._note(f"{res.by}: {res.verdict}" + (f" ({res.reason})" if res.reason else ""))
        if res.verdict == "landed":
            return "landed", res.by, res.result
        if res.verdict == "abandon":
            return "abandon", res.by, res.reason
        return "not_landed", res.by, None

    @workflow.signal(name=RESOLVE_SIGNAL)
    def resolve(self, res: Resolution) -> None:
        if self._phase != "parked" or self._waiting is not None:
            outcome = f"rejected: the call is not parked (it is {self._phase})"
            workflow.logger.warning("exactcall reconcile.resolution_rejected: %s", outcome)
        else:
            self._waiting = res
            outcome = "accepted"
        self._resolutions.append((res, outcome))

    @workflow.signal(name=CANCELLED_SIGNAL)
    def call_cancelled(self) -> None:
        """The call's workflow cancelled it: "not landed" will release the key, not re-run."""
        if not self._call_cancelled:
            self._call_cancelled = True
            self._note("the call was cancelled by its workflow: it will not be run again")
            self._show()

    async def _release_cancelled(self, inp: ReconcileInput, by: str) -> Settled:
        reason = f"not landed (decided by {by}); the call was cancelled, so it is not run again"
        await self._mark(inp, "not_landed", reason=reason)
        return await self._finish(
            inp,
            Settled(
                outcome="failed",
                verdict="not_landed",
                decided_by=by,
                reason=reason,
                error_type=CANCELLED_ERROR,
            ),
            marked=True,
        )

    @workflow.query(name=RECONCILE_STATE_QUERY)
    def state(self) -> ReconcileState:
        return ReconcileState(
            phase="settled" if self._settled else self._phase,  # type: ignore[arg-type]
            reason=self._reason,
            history=self._history,
            resolutions=self._resolutions,
            settled=self._settled,
        )

    # -- recording --------------------------------------------------------------------------
    async def _finish(self, inp: ReconcileInput, s: Settled, marked: bool = False) -> Settled:
        if not marked and s.outcome == "done":
            await self._mark(inp, "done", result=s.result)
        elif s.outcome == "abandoned":
            await self._mark(inp, "abandoned", reason=s.reason)
        self._settled = s
        verdict = {"verdict": s.verdict, "outcome": s.outcome, "by": s.decided_by}
        if self._settler_reason:  # `exactcall resolve --reason`: the audit shows it
            verdict["settler_reason"] = self._settler_reason
        workflow.upsert_memo({VERDICT_MEMO: verdict})
        self._note(f"settled: {s.outcome} ({s.verdict}, decided by {s.decided_by})")
        await self._settle_budgets(inp, s)
        if workflow.info().parent is None and (
            self._decided_at_start or workflow.patched(TELLS_THE_CALL)
        ):
            await self._tell_the_call(inp, s)
        return s

    async def _settle_budgets(self, inp: ReconcileInput, s: Settled) -> None:
        """The call's budget reservations, kept while its outcome was unknown: landed or
        abandoned keeps them (it may have happened), failed (not landed, then a re-run that
        failed or did not happen) releases them. From the input (runs recorded before it
        carried them look the tool up in this worker's registry)."""
        if self._decided_at_start and inp.budget_charges is not None:
            await settle_ops(inp.budget_charges, spent=s.outcome != "failed")
            return
        try:
            t = get_tool(inp.intent.tool)
        except UnknownTool:
            return
        if t.options.budgets and workflow.patched(BUDGETS_PATCH):
            await settle_intent(t, inp.intent, spent=s.outcome != "failed")

    @staticmethod
    async def _tell_the_call(inp: ReconcileInput, s: Settled) -> None:
        """Not started as a child (the attempt that found the outcome unknown started it):
        the workflow of the call gets the verdict by signal, if it still runs."""
        note = SettledNote(key=inp.intent.key, settled=s)
        handle = workflow.get_external_workflow_handle(inp.intent.workflow_id)
        try:
            await handle.signal(SETTLED_SIGNAL, note)
        except FailureError:
            workflow.logger.info("exactcall reconcile: the call's workflow has ended")

    @workflow.signal(name=JOINED_SIGNAL)
    def joined(self) -> None:
        """The call's workflow waits for the verdict (the signal is accepted only while this
        runs, which is what it learns from it)."""

    async def _mark(self, inp: ReconcileInput, kind: str, **fields: Any) -> None:
        owner = Owner(run_id=workflow.info().run_id, activity_id="reconcile")
        ev = RecordEvent(kind=kind, owner=owner, attempt=0, **fields)  # type: ignore[arg-type]
        # asked in every run (its marker is the command before the local activity: a task
        # whose first command is a local activity never completes on a worker that caches no
        # workflows; it times out and runs again)
        by_activity = workflow.patched(MARKS_BY_ACTIVITY)
        if not (self._decided_at_start or by_activity):
            await mark_from_workflow(inp.intent.key, ev)
            return
        await workflow.execute_local_activity(
            MARK_RECORD,
            args=[inp.intent, ev],
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            summary=f"record {kind} for {inp.intent.tool} {inp.intent.step}",
        )

    def _publish(self, inp: ReconcileInput, parked: bool) -> None:
        self._parked = parked
        i = inp.intent
        row = UnresolvedCall(
            workflow_id=i.workflow_id,
            step=i.step,
            tool=i.tool,
            args=i.args,
            args_hash=i.args_hash,
            key=i.key,
            since=inp.since,
            reason=self._reason,
            reconcile_id=workflow.info().workflow_id,
        )
        workflow.upsert_memo({UNRESOLVED_MEMO: row.model_dump(mode="json") if parked else None})
        if pinned_search_attributes():  # the choice recorded in this history, not the flag
            workflow.upsert_search_attributes([UNRESOLVED_KEY.value_set(parked)])
        self._show()

    def _show(self) -> None:
        """While parked, the current details (the Temporal UI's workflow page) say why and
        give the ``exactcall resolve`` commands; cleared once a person decided."""
        inp = self._input
        if inp is None or (not self._parked and not workflow.get_current_details()):
            return
        workflow.set_current_details(
            parked_details(inp.intent, self._reason, inp.since, self._call_cancelled)
            if self._parked
            else ""
        )

    def _note(self, line: str) -> None:
        self._history.append(f"{workflow.now().isoformat()} {line}")
        workflow.logger.info("exactcall reconcile: %s", line)
