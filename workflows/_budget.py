"""Budgets in workflows: the ledger, a workflow of exactcall's (what a call does with it is in
``_budget_calls``).

The ledger holds every charge of one budget (or of one budget and workflow id), by the call's
key. A worker process sends it what it has at a time as one ``batch`` Update: reservations,
each refused (``ok=False`` with the figures) if it would pass the limit, taken in order, and
settles; a batch whose reservations are all refused is refused by the validator (no history).
``reserve`` (one reservation per Update) and ``settle`` (a signal) are the earlier protocol,
still answered. A run's later reservations may also ask for an allowance (budget the run holds
for its next calls); a call drawn from it is reported with the run's spends, and its units
move from the allowance to the call's own charge. All of it is idempotent by key. It
continues as new before its history grows large, carrying the charges; a ledger with nothing
reserved and no charge for ``IDLE`` closes (a windowed budget's closed windows are then
forgotten, which they may be).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from functools import partial
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from exactcall._wire import (
    BUDGET_BATCH_SIGNAL,
    BUDGET_BATCH_UPDATE,
    BUDGET_MEMO,
    BUDGET_OVER,
    BUDGET_RESERVE_UPDATE,
    BUDGET_SETTLE_SIGNAL,
    BUDGET_STATE_QUERY,
    BUDGET_WORKFLOW,
)
from exactcall.budgets._budget import (
    KEY_PREFIX,
    BatchAnswer,
    BudgetView,
    Charge,
    ChargeAnswer,
    ChargeBatch,
    ChargeOp,
    LedgerInput,
    WindowTotals,
    window_end,
)

__all__ = ["BudgetLedger"]

IDLE = timedelta(days=7)
EARLY_KEPT = 5_000
"""Settles that came before their charge, carried over continue-as-new (the newest)."""
OVER = BUDGET_OVER  # the validator's refusal (what the activity turns into ok=False)


@workflow.defn(name=BUDGET_WORKFLOW, sandboxed=False)  # pure code over exactcall's models
class BudgetLedger:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        # set before any Update is handled: the first reservation comes with the start
        self._inp: LedgerInput | None = inp
        self._limit = inp.limit
        self._charges: dict[str, Charge] = {}
        self._sums: dict[str, list[float]] = {}  # window -> [spent, reserved] of _charges
        for c in inp.charges:
            self._put(c)
        self._spent_keys = {k for keys in inp.spent_keys.values() for k in keys}
        self._early = dict(inp.early)
        self._touched = 0
        self._last_change = workflow.now()
        self._idle = False

    def _woken(self, seen: int, max_events: int) -> bool:
        """Something changed since ``seen``, the history should continue as new, or idle."""
        return self._touched != seen or _suggested(max_events) or self._idle

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        # one timer for the ledger's idleness, not one per workflow task: each would be a
        # cancel and a start in every reservation's workflow task
        watch = asyncio.create_task(self._watch_idle())
        published = -1
        while True:
            if published != self._touched:  # once per workflow task that changed something
                published = self._touched
                self._last_change = workflow.now()
                view = self.state().model_dump(mode="json", exclude={"charges"})
                workflow.upsert_memo({BUDGET_MEMO: view})
            seen = self._touched
            await workflow.wait_condition(partial(self._woken, seen, inp.max_events))
            if self._idle and self._touched == seen:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if self._touched == seen:
                    watch.cancel()
                    return
            if _suggested(inp.max_events):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry())

    async def _watch_idle(self) -> None:
        """Sets ``_idle`` once nothing is reserved and nothing changed for ``IDLE``."""
        while True:
            since = workflow.now() - self._last_change
            if since >= IDLE:
                if not any(c.state == "reserved" for c in self._charges.values()):
                    self._idle = True
                    return
                since = timedelta(0)  # a call not settled yet: look again in IDLE
            await workflow.sleep(IDLE - since, summary="budget idle")

    def _carry(self) -> LedgerInput:
        """The next run's input: the reserved charges in full; the others summarised into
        their window's totals, keeping a spent charge's key (its first ``KEY_PREFIX`` hex
        digits) while its window is open and for ``IDLE`` after, so the input stays small
        however many calls a window has (a call re-run later than that is a new charge)."""
        assert self._inp is not None
        inp = self._inp
        now = workflow.now()
        pruned = {w: dict(t) for w, t in inp.pruned.items()}
        spent_keys = {
            w: list(ks)
            for w, ks in inp.spent_keys.items()
            if (end := window_end(w, inp.per_seconds)) is None or end + IDLE > now
        }
        keep = []
        for c in self._charges.values():
            if c.state == "reserved":
                keep.append(c)
                continue
            if c.state == "released":
                continue  # counted nowhere: a re-run of that call reserves again
            t = pruned.setdefault(c.window, {"spent": 0.0, "calls": 0.0, "overruns": 0.0})
            t["spent"] += c.measure
            t["calls"] += 1
            t["overruns"] += c.overrun
            end = window_end(c.window, inp.per_seconds)
            if end is None or end + IDLE > now:
                spent_keys.setdefault(c.window, []).append(c.key[:KEY_PREFIX])
        return inp.model_copy(
            update={
                "limit": self._limit,
                "charges": keep,
                "pruned": pruned,
                "spent_keys": spent_keys,
                "early": dict(list(self._early.items())[-EARLY_KEPT:]),
            }
        )

    def _put(self, c: Charge) -> None:
        """Record ``c`` (new, or in place of its key's charge), keeping each window's sums
        (spent, reserved, calls, overruns of the charges held)."""
        for old, sign in ((self._charges.get(c.key), -1.0), (c, 1.0)):
            if old is not None and old.state != "released":
                sums = self._sums.setdefault(old.window, [0.0, 0.0, 0.0, 0.0])
                sums[0 if old.state == "spent" else 1] += sign * old.measure
                sums[2] += sign * (not old.allowance)
                sums[3] += sign * old.overrun
        self._sums.setdefault(c.window, [0.0, 0.0, 0.0, 0.0])  # listed, as totals() does
        self._charges[c.key] = c

    def _windows(self) -> list[WindowTotals]:
        """What ``totals`` makes of the charges, from the sums (no walk over the charges)."""
        assert self._inp is not None
        out: dict[str, list[float]] = {}
        for w, t in self._inp.pruned.items():
            out[w] = [t.get("spent", 0.0), 0.0, t.get("calls", 0.0), t.get("overruns", 0.0)]
        for w, sums in self._sums.items():
            row = out.setdefault(w, [0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate(sums):
                row[i] += v
        return [
            WindowTotals(
                window=w,
                spent=t[0],
                reserved=t[1],
                limit=self._limit,
                calls=round(t[2]),
                overruns=round(t[3]),
            )
            for w, t in sorted(out.items())
        ]

    def _used(self, window: str) -> tuple[float, float]:
        """Spent and reserved in ``window`` (kept as sums: a batch of n reservations costs
        n, not n times the charges)."""
        spent, reserved = self._sums.get(window, (0.0, 0.0))[:2]
        assert self._inp is not None
        spent += self._inp.pruned.get(window, {}).get("spent", 0.0)
        return spent, reserved

    def _summarised(self, key: str) -> bool:
        """Spent before the ledger last continued as new: kept as its key only."""
        return key[:KEY_PREFIX] in self._spent_keys and key not in self._charges

    def _refusal(self, op: ChargeOp) -> ApplicationError | None:
        if op.key in self._charges or op.overrun_approved_by is not None:
            return None
        if self._summarised(op.key):
            return None
        spent, reserved = self._used(op.window)
        if spent + reserved + op.measure <= op.limit:
            return None
        return ApplicationError(
            f"budget {op.budget}: {spent} spent, {reserved} reserved, this call {op.measure}, "
            f"limit {op.limit}",
            {"spent": spent, "reserved": reserved, "limit": op.limit, "window": op.window},
            type=OVER,
            non_retryable=True,
        )

    @workflow.update(name=BUDGET_RESERVE_UPDATE)
    def reserve(self, op: ChargeOp) -> ChargeAnswer:
        self._limit = op.limit  # the declaration of the latest call
        refused = self._refusal(op)
        if refused is not None:  # validated together with another reservation
            raise refused
        return self._reserve(op)

    @workflow.update(name=BUDGET_BATCH_UPDATE)
    def batch(self, batch: ChargeBatch) -> BatchAnswer:
        """Each operation in order: a reservation that would pass the limit is answered
        ``ok=False`` with the figures (the others of the batch go on)."""
        answers = []
        for op in batch.ops:
            if _drawn_report(op):
                self._drawn(op)
            elif op.lease and op.key == op.lease:
                self._give_back(op)
            elif op.op != "reserve":
                self.settle(op)
            else:
                self._limit = op.limit
                refused = self._refusal(op)
                answers.append(self._reserve(op) if refused is None else _refused(refused, op))
                if refused is None and op.allowance > 0 and op.lease:
                    answers[-1] = self._grant(op, answers[-1])
                continue
            answers.append(ChargeAnswer(ok=True, state=op.op, limit=op.limit, window=op.window))
        return BatchAnswer(answers=answers)

    def _grant(self, op: ChargeOp, answer: ChargeAnswer) -> ChargeAnswer:
        """Hold up to ``op.allowance`` more for the run's next calls: at most a quarter of
        what is free once this call is reserved (near the limit, nothing: each call then
        reserves for itself, exactly), and at least one more call's worth."""
        held = self._charges.get(op.lease)
        if held is None:
            spent, reserved = self._used(op.window)
            grant = min(op.allowance, (op.limit - spent - reserved) / 4)
            grant = math.floor(grant / op.measure) * op.measure  # whole calls' worth
            if grant <= 0:
                return answer
            held = Charge(
                key=op.lease,
                workflow_id=op.workflow_id,
                step="(allowance)",
                tool=op.tool,
                measure=grant,
                window=op.window,
                state="reserved",
                at=workflow.now(),
                allowance=True,
            )
            self._put(held)
            self._touched += 1
        if held.state != "reserved":
            return answer
        return answer.model_copy(update={"allowance": held.measure, "lease": held.key})

    def _give_back(self, op: ChargeOp) -> None:
        """A run gives back what it has not drawn of its allowance: ``op.measure`` is all it
        has drawn from it, so the allowance keeps what of that is not reported yet (given
        back again, by a retried activity, nothing changes); one that keeps nothing is
        released."""
        lease = self._charges.get(op.lease)
        if lease is None or lease.state != "reserved":
            return
        left = max(0.0, min(lease.measure, op.measure - lease.drawn))
        state = "reserved" if left > 0 else "released"
        self._put(lease.model_copy(update={"measure": left, "state": state}))
        self._touched += 1

    def _drawn(self, op: ChargeOp) -> None:
        """A call a run drew from its allowance (``op.lease``), reported: its units move out
        of the allowance into the call's own charge (reserved, or spent), or are released if
        the call was charged before (a re-run, a reset) or its settle came first. Reported
        again (a retried activity), it changes nothing."""
        c = self._charges.get(op.key)
        if c is not None and c.lease == op.lease:
            return
        if c is None and self._summarised(op.key):
            return  # charged before, or this very report before the ledger continued as new:
            # the units stay in the allowance (never counted twice, at worst held too long)
        lease = self._charges.get(op.lease)
        if lease is not None and lease.state == "reserved":
            self._put(
                lease.model_copy(
                    update={
                        "measure": max(0.0, lease.measure - op.measure),
                        "drawn": lease.drawn + op.measure,
                    }
                )
            )
        self._touched += 1
        if c is not None:
            return  # charged before: the units are released
        first = self._early.pop(op.key, "")
        if first == "release" and op.op != "spend":
            # kept (released) so a retry finds it; a run that reports the call spent knows
            # it happened (a re-run under the same key), whatever an earlier settle said
            self._put(self._charge(op, "released"))
            return
        spent = first == "spend" or op.op == "spend"
        self._put(self._charge(op, "spent" if spent else "reserved"))

    def _charge(self, op: ChargeOp, state: Literal["reserved", "spent", "released"]) -> Charge:
        return Charge(
            key=op.key,
            workflow_id=op.workflow_id,
            step=op.step,
            tool=op.tool,
            measure=op.measure,
            window=op.window,
            state=state,
            at=workflow.now(),
            lease=op.lease,
        )

    @batch.validator
    def _validate_batch(self, batch: ChargeBatch) -> None:
        """A batch of reservations that would all pass the limit writes no history: refused
        whole, with each one's figures."""
        figures = []
        for op in batch.ops:
            refused = self._refusal(op) if op.op == "reserve" and not _drawn_report(op) else None
            if refused is None:
                return
            figures.append(refused.details[0])
        raise ApplicationError("every reservation would pass the limit", figures, type=OVER)

    @workflow.signal(name=BUDGET_BATCH_SIGNAL)
    def settle_batch(self, batch: ChargeBatch) -> None:
        for op in batch.ops:
            self.settle(op)

    def _reserve(self, op: ChargeOp) -> ChargeAnswer:
        if self._summarised(op.key):  # charged once already
            return self._answer(op.window, "spent")
        c = self._charges.get(op.key)
        if c is None:
            c = self._charge(op, "reserved").model_copy(
                update={
                    "overrun": op.overrun_approved_by is not None,
                    "approved_by": op.overrun_approved_by or (),
                    "lease": "",
                }
            )
            self._put(c)
            self._touched += 1
        return self._answer(c.window, c.state)

    @reserve.validator
    def _validate_reserve(self, op: ChargeOp) -> None:
        refused = self._refusal(op)
        if refused is not None:
            raise refused

    @workflow.signal(name=BUDGET_SETTLE_SIGNAL)
    def settle(self, op: ChargeOp) -> None:
        """A signal, not an Update: the caller needs no answer and does not wait for this
        ledger's workflow task (its reservation was accepted before, so the charge is here)."""
        c = self._charges.get(op.key)
        if c is not None and c.state == "reserved":
            c = c.model_copy(update={"state": "spent" if op.op == "spend" else "released"})
            self._put(c)
            self._touched += 1
        elif c is None and op.key != op.lease and not self._summarised(op.key):
            self._early[op.key] = op.op  # its charge may come later, drawn from an allowance

    def _answer(self, window: str, state: str) -> ChargeAnswer:
        spent, reserved = self._used(window)
        return ChargeAnswer(
            ok=True, state=state, spent=spent, reserved=reserved, limit=self._limit, window=window
        )

    @workflow.query(name=BUDGET_STATE_QUERY)
    def state(self, with_charges: bool = False) -> BudgetView:
        assert self._inp is not None
        charges = list(self._charges.values()) if with_charges else []
        return BudgetView(
            budget=self._inp.budget,
            scope=self._inp.scope,
            limit=self._limit,
            per_seconds=self._inp.per_seconds,
            windows=self._windows(),
            charges=charges if with_charges else [],
        )


def _drawn_report(op: ChargeOp) -> bool:
    """A call drawn from a run's allowance, reported (not a reservation: never refused)."""
    return bool(op.lease) and op.key != op.lease and op.allowance == 0


def _refused(err: ApplicationError, op: ChargeOp) -> ChargeAnswer:
    f = err.details[0]
    return ChargeAnswer(
        ok=False, spent=f["spent"], reserved=f["reserved"], limit=f["limit"], window=op.window
    )


def _suggested(max_events: int) -> bool:
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.get_current_history_length() > max_events
