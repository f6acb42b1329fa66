"""What a budgeted call does with its ledgers, in workflow code (the ledger is in ``_budget``).

A call (``reserve_for``, then ``settle_for`` or ``spend_for``) reaches its ledgers through the
``exactcall.budget`` local activity: one marker in the caller's history per ledger operation.

Since BUDGET_SPENDS_CARRIED a done call's spend waits for the run's next reservation (one
Update for both) or the end of the run's code. Since BUDGET_ALLOWANCES a run's second and
later reservations on a ledger also ask for an allowance: 1, 2, 4 ... ``AHEAD`` more calls'
worth, of which the ledger grants at most a quarter of what is free (near the limit,
nothing). The run's next calls draw from it in workflow code, before their tool runs and
before any approval wait, with no ledger round trip; a drawn call is reported with the run's
spends (done: spent; unknown: reserved until its reconciliation settles it), one that did
not happen goes back to the allowance, and what is left is released when the run's code
ends. A one-call run never asks, so many runs at once each reserve exactly what they use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from exactcall._model import Intent
from exactcall._tool import Tool
from exactcall._wire import BUDGET_ACTIVITY, BUDGET_ALLOWANCES, BUDGET_SPENDS_CARRIED
from exactcall.budgets._budget import Budget, ChargeAnswer, ChargeOp, charge_op, settle_charges
from exactcall.workflows._state import WorkflowState, state

__all__ = [
    "Allowance",
    "Held",
    "keep_for",
    "reserve_for",
    "reserve_overruns",
    "send_spends",
    "settle_for",
    "settle_intent",
    "settle_ops",
    "spend_for",
]

AHEAD = 16
"""The most calls' worth a run asks to hold ahead, on one ledger."""


@dataclass
class Allowance:
    """Budget this run holds on one ledger and window for its next calls."""

    lease: str
    """The allowance's key in the ledger."""
    ask: ChargeOp
    """The reservation that asked for it (what its release is made from)."""
    granted: float
    left: float


@dataclass
class Held:
    """A budget a call has reserved on (to spend or release when its outcome is known)."""

    budget: Budget
    op: ChargeOp
    drawn: Allowance | None = None
    """The run's allowance it was drawn from (``op.lease`` names it), or None: reserved in
    the ledger under the call's own key."""


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


def _draw(st: WorkflowState, op: ChargeOp) -> Allowance | None:
    for a in reversed(st.budget_allowances):
        if a.ask.ledger_id == op.ledger_id and a.ask.window == op.window and a.left >= op.measure:
            a.left -= op.measure
            return a
    return None


def _give_back(a: Allowance) -> ChargeOp:
    """What gives back the part of ``a`` the run has not drawn: it says what the run has
    drawn in all (the ledger keeps what of that it has not been told of yet), so sending it
    twice gives back nothing more."""
    drawn = a.granted - a.left
    return a.ask.model_copy(
        update={"op": "release", "key": a.lease, "lease": a.lease, "measure": drawn}
    )


def _give_back_short(st: WorkflowState, op: ChargeOp) -> list[ChargeOp]:
    """The run's allowances on this ledger and window too small for this call: given back
    with the reservation (before it, in the same Update), so they do not count against it."""
    short = [
        a
        for a in st.budget_allowances
        if a.ask.ledger_id == op.ledger_id and a.ask.window == op.window and a.left < op.measure
    ]
    for a in short:
        st.budget_allowances.remove(a)
    return [_give_back(a) for a in short]


def _ask(st: WorkflowState, op: ChargeOp, intent: Intent) -> dict[str, object]:
    """What this reservation asks for beyond the call: nothing on a run's first reservation
    on the ledger, then 1, 2, 4 ... AHEAD calls' worth (BUDGET_ALLOWANCES)."""
    asks = st.budget_asks.get(op.ledger_id, 0)
    st.budget_asks[op.ledger_id] = asks + 1
    if not asks or op.measure <= 0 or not workflow.patched(BUDGET_ALLOWANCES):
        return {}
    lease = f"allowance:{workflow.info().run_id}:{intent.key[:32]}"
    return {"allowance": op.measure * min(2 ** (asks - 1), AHEAD), "lease": lease}


async def reserve_for(t: Tool, intent: Intent) -> tuple[list[Held], list[Over]]:
    """Reserve the call's measure on each of its tool's budgets: from the run's allowance
    when it holds enough, else in the ledger. Measures are checked first, so bad input
    reserves nothing. A ledger reservation carries the spends the run has not sent yet."""
    now = workflow.now()
    plan = [(b, b.measure_of(t.name, intent.args)) for b in t.options.budgets]
    held: list[Held] = []
    over: list[Over] = []
    st = state()
    pending = st.budget_spends
    for b, m in plan:
        op = charge_op(b, intent, m, b.window_of(now))
        drawn = _draw(st, op)
        if drawn is not None:
            held.append(Held(b, op.model_copy(update={"lease": drawn.lease}), drawn))
            continue
        ask = _ask(st, op, intent)
        carried = [*pending, *_give_back_short(st, op)]
        answer = await _charge(op.model_copy(update={"settles": tuple(carried), **ask}))
        for c in carried:  # in the ledgers now (another flight may have sent them too)
            if c in pending:
                pending.remove(c)
        if answer.ok:
            held.append(Held(b, op))
            lease = answer.lease or str(ask.get("lease", ""))  # its key as the ledger has it
            if answer.allowance > 0 and lease:
                st.budget_allowances.append(
                    Allowance(lease, op, answer.allowance, answer.allowance)
                )
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


def keep_for(held: Sequence[Held]) -> None:
    """The call's outcome is unknown: its reservations stay until its reconciliation settles
    them by key. A drawn call is reported as reserved under its own key (with the run's
    spends), so that the settle finds it (or, come first, is applied when it arrives)."""
    st = state()
    st.budget_spends.extend(h.op.model_copy(update={"op": "reserve"}) for h in held if h.drawn)


async def send_spends(st: WorkflowState) -> None:
    """The run's code has ended: send the spends no reservation carried, then release what
    is left of its allowances (in one operation for each ledger, in that order)."""
    ops = [*st.budget_spends, *(_give_back(a) for a in st.budget_allowances)]
    if not ops:
        return
    *rest, last = ops
    await _charge(last.model_copy(update={"settles": tuple(rest)}))
    st.budget_spends.clear()
    st.budget_allowances.clear()


async def settle_for(held: Sequence[Held], spent: bool) -> None:
    """The call's outcome is known: keep (spend) or release each reservation. A drawn call
    that did not happen goes back to the run's allowance (the ledger never saw it)."""
    st = state()
    for h in held:
        if h.drawn is not None and not spent:
            if h.drawn not in st.budget_allowances:  # given back meanwhile: hold it again
                h.drawn.left = 0.0
                st.budget_allowances.append(h.drawn)
            h.drawn.left += h.op.measure
            continue
        await _charge(h.op.model_copy(update={"op": "spend" if spent else "release"}))
