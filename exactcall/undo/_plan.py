"""What ``exactcall undo`` does with each call of a run: a pure decision over what the
histories say (the run's calls, with their verdicts, and every undo already made of them).

An undo is the call ``<step>.undo`` of the undone call's workflow id, whichever process makes
it (the run's saga, or ``exactcall undo``), so its key is the same and its record decides who
makes it. This module only chooses which undos to ask for, and says why the others are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exactcall._calls import RunCall
from exactcall.undo._undo import is_undo_step, undo_step

__all__ = ["UndoPlan", "plan_undo"]

_NOT_HAPPENED = ("failed", "conflict", "cancelled", "denied", "expired", "approved")
"""Outcomes of calls that made no effect to undo (``approved``: a framework's approval whose
call ran under another step)."""
_UNDO_RANK = {"done": 5, "running": 4, "pending": 4, "unknown": 3, "unresolved": 3}
"""Which of several records of one undo tells what became of it (its key is one: at most one
made the effect; a done one says it, a running one may yet)."""


@dataclass
class UndoPlan:
    todo: list[RunCall] = field(default_factory=list)
    """Calls to undo, in the order they ended (the undo workflow undoes newest first)."""
    already: dict[str, str] = field(default_factory=dict)
    """Calls undone already, with where (``in the run``, ``by exactcall undo``)."""
    blocked: dict[str, str] = field(default_factory=dict)
    """Calls that should be undone and are not now, with why and what settles it."""
    nothing: dict[str, str] = field(default_factory=dict)
    """Calls with nothing to undo: they did not happen (with their outcome)."""


def plan_undo(
    workflow_id: str,
    calls: Sequence[RunCall],
    undos: Iterable[RunCall],
    steps: Sequence[str] = (),
) -> UndoPlan:
    """Decide, for each call of the run (``steps``: only those), whether to undo it now.

    ``calls``: the run's calls, unknown outcomes given their verdicts; ``undos``: the undos
    already made of this workflow id's calls, anywhere (the run's own undo steps among them)."""
    best: dict[str, RunCall] = {}
    for made in undos:
        if not is_undo_step(made.step):
            continue
        held = best.get(made.step)
        if held is None or _UNDO_RANK.get(made.outcome, 0) > _UNDO_RANK.get(held.outcome, 0):
            best[made.step] = made
    plan = UndoPlan()
    for c in calls:
        if is_undo_step(c.step) or (steps and c.step not in steps):
            continue
        u: RunCall | None = best.get(undo_step(c.step))
        if c.outcome == "undone" or (u is not None and u.outcome == "done"):
            where = (
                " in the run" if u is None or u.run_id == c.run_id else ", made by exactcall undo"
            )
            plan.already[c.step] = f"{c.undone_by or undo_step(c.step)}{where}"
        elif c.outcome in ("unknown", "unresolved"):
            plan.blocked[c.step] = (
                "its outcome is unknown: settle it first (exactcall resolve "
                f"{workflow_id} {c.step} --landed --result JSON|--not-landed), then undo again"
            )
        elif c.outcome in ("running", "pending"):
            plan.blocked[c.step] = f"it is still {c.outcome}: undo it once it has ended"
        elif c.outcome != "done":
            plan.nothing[c.step] = c.outcome
        elif u is not None and u.outcome in ("running", "pending"):
            plan.blocked[c.step] = f"its undo {u.step} is running now: run this again once it ended"
        elif u is not None and u.outcome in ("unknown", "unresolved"):
            plan.blocked[c.step] = (
                f"its undo's outcome is unknown (reconciliation {u.reconcile_id}): settle it "
                f"(exactcall resolve {workflow_id} {u.step} --landed --result JSON|--not-landed)"
            )
        elif u is not None and u.outcome == "abandoned":
            plan.blocked[c.step] = f"its undo {u.step} was abandoned by {u.settled_by or '?'}"
        else:  # never made, or made and failed (it did not happen): make it, under its key
            plan.todo.append(c)
    plan.todo.sort(key=lambda c: c.ended_at or c.time)
    return plan
