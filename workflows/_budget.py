"""Budgets in workflows: the ledger (a workflow of exactcall's), and what a call does with it.

The ledger holds every charge of one budget (or of one budget and workflow id), by the call's
key. ``reserve`` is an Update whose validator refuses a reservation that would pass the limit
(no history is written for a refusal); its handler checks again (two Updates delivered in one
workflow task are validated before either handler runs) and records the charge. ``settle`` (a
signal: the caller does not wait for the ledger) marks a charge spent or released. Both are
idempotent by key. It continues as new before its history grows large, carrying the charges;
a ledger with nothing reserved and no charge for ``IDLE`` closes (a windowed budget's
closed windows are then forgotten, which they may be).

A call (``reserve_for``, then ``settle_for``) reaches its ledgers through the
``exactcall.budget`` local activity: one marker in the caller's history per ledger operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from exactcall._budget import (
    KEY_PREFIX,
    BatchAnswer,
    Budget,
    BudgetView,
    Charge,
    ChargeAnswer,
    ChargeBatch,
    ChargeOp,
    LedgerInput,
    WindowTotals,
    charge_op,
    settle_charges,
    window_end,
)
from exactcall._model import Intent
from exactcall._tool import Tool
from exactcall._wire import (
    BUDGET_ACTIVITY,
    BUDGET_BATCH_SIGNAL,
    BUDGET_BATCH_UPDATE,
    BUDGET_MEMO,
    BUDGET_OVER,
    BUDGET_RESERVE_UPDATE,
    BUDGET_SETTLE_SIGNAL,
    BUDGET_SPENDS_CARRIED,
    BUDGET_STATE_QUERY,
    BUDGET_WORKFLOW,
)

from ._state import WorkflowState, state

__all__ = [
    "BudgetLedger",
    "Held",
    "reserve_for",
    "reserve_overruns",
    "send_spends",
    "settle_for",
    "settle_intent",
    "spend_for",
]

IDLE = timedelta(days=7)
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
        self._touched = 0
        self._last_change = workflow.now()
        self._idle = False

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
            await workflow.wait_condition(
                lambda seen=seen: self._touched != seen or _suggested(inp.max_events) or self._idle
            )
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
            }
        )

    def _put(self, c: Charge) -> None:
        """Record ``c`` (new, or in place of its key's charge), keeping each window's sums
        (spent, reserved, calls, overruns of the charges held)."""
        for old, sign in ((self._charges.get(c.key), -1.0), (c, 1.0)):
            if old is not None and old.state != "released":
                sums = self._sums.setdefault(old.window, [0.0, 0.0, 0.0, 0.0])
                sums[0 if old.state == "spent" else 1] += sign * old.measure
                sums[2] += sign
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
            if op.op != "reserve":
                self.settle(op)
                answers.append(ChargeAnswer(ok=True, state=op.op, limit=op.limit, window=op.window))
                continue
            self._limit = op.limit
            refused = self._refusal(op)
            answers.append(self._reserve(op) if refused is None else _refused(refused, op))
        return BatchAnswer(answers=answers)

    @batch.validator
    def _validate_batch(self, batch: ChargeBatch) -> None:
        """A batch of reservations that would all pass the limit writes no history: refused
        whole, with each one's figures."""
        figures = []
        for op in batch.ops:
            refused = self._refusal(op) if op.op == "reserve" else None
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
            c = Charge(
                key=op.key,
                workflow_id=op.workflow_id,
                step=op.step,
                tool=op.tool,
                measure=op.measure,
                window=op.window,
                state="reserved",
                overrun=op.overrun_approved_by is not None,
                approved_by=op.overrun_approved_by or (),
                at=workflow.now(),
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


def _refused(err: ApplicationError, op: ChargeOp) -> ChargeAnswer:
    f = err.details[0]
    return ChargeAnswer(
        ok=False, spent=f["spent"], reserved=f["reserved"], limit=f["limit"], window=op.window
    )


def _suggested(max_events: int) -> bool:
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.get_current_history_length() > max_events


# -- the calling side ------------------------------------------------------------------------
@dataclass
class Held:
    """A budget a call has reserved on (to spend or release when its outcome is known)."""

    budget: Budget
    op: ChargeOp


@dataclass
class Over:
    """A budget the call would pass: what a person is asked about."""

    budget: Budget
    op: ChargeOp
    answer: ChargeAnswer


async def _charge(op: ChargeOp) -> ChargeAnswer:
    return await workflow.execute_local_activity(
        BUDGET_ACTIVITY,
        op,
        result_type=ChargeAnswer,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=5)),
        summary=f"budget {op.budget}: {op.op} {op.tool} {op.step}",
    )


async def reserve_for(t: Tool, intent: Intent) -> tuple[list[Held], list[Over]]:
    """Reserve the call's measure on each of its tool's budgets. Measures are checked first,
    so bad input reserves nothing. The first reservation carries the spends the run has not
    sent yet (BUDGET_SPENDS_CARRIED)."""
    now = workflow.now()
    plan = [(b, b.measure_of(t.name, intent.args)) for b in t.options.budgets]
    held: list[Held] = []
    over: list[Over] = []
    pending = state().budget_spends
    for b, m in plan:
        op = charge_op(b, intent, m, b.window_of(now))
        carried = list(pending)
        answer = await _charge(op.model_copy(update={"settles": tuple(carried)}))
        for c in carried:  # in the ledgers now (another flight may have sent them too)
            if c in pending:
                pending.remove(c)
        if answer.ok:
            held.append(Held(b, op))
        else:
            over.append(Over(b, op, answer))
    return held, over


async def reserve_overruns(over: Sequence[Over], approved_by: tuple[str, ...]) -> list[Held]:
    """A person said yes: reserve each passed budget as an approved overrun."""
    out = []
    for o in over:
        op = o.op.model_copy(update={"overrun_approved_by": approved_by})
        await _charge(op)
        out.append(Held(o.budget, op))
    return out


async def settle_intent(t: Tool, intent: Intent, spent: bool) -> None:
    """Settle the reservations of ``intent`` (a reconciliation's verdict on an unknown
    outcome): by key, so nothing of the call is needed but its tool's budgets."""
    await settle_ops(settle_charges(t.options.budgets, intent), spent)


async def settle_ops(ops: Sequence[ChargeOp], spent: bool) -> None:
    """Keep (spend) or release the reservations ``ops`` name (as ``settle_charges`` made them)."""
    for op in ops:
        await _charge(op.model_copy(update={"op": "spend" if spent else "release"}))


async def spend_for(held: Sequence[Held]) -> None:
    """The call is done: its reservations are kept. Since BUDGET_SPENDS_CARRIED the spends
    wait for the run's next reservation (one Update for both) or the end of the run's code;
    the charge counts against the limit the same whether reserved or spent."""
    if not held:
        return
    if not workflow.patched(BUDGET_SPENDS_CARRIED):
        await settle_for(held, spent=True)
        return
    state().budget_spends.extend(h.op.model_copy(update={"op": "spend"}) for h in held)


async def send_spends(st: WorkflowState) -> None:
    """Send the run's spends that no reservation carried (its code has ended)."""
    while st.budget_spends:
        first, *rest = st.budget_spends
        await _charge(first.model_copy(update={"settles": tuple(rest)}))
        for c in (first, *rest):
            if c in st.budget_spends:
                st.budget_spends.remove(c)


async def settle_for(held: Sequence[Held], spent: bool) -> None:
    """The call's outcome is known: keep (spend) or release each reservation."""
    for h in held:
        await _charge(h.op.model_copy(update={"op": "spend" if spent else "release"}))
