"""``exactcall diff``: the tool calls of two runs side by side, matched by step.

Each run is a workflow id (its latest run), ``ID:RUN_ID``, a history JSON file (as
``temporal workflow show --output json`` and ``exactcall history export`` write it), or, in the
test kit, a ``WorkflowHistory`` or a list of intents; ``session:ID`` is every call of the
``exactcall.session`` ID. A step is *same* (tool, arguments and
version), *changed* (the arguments that differ, old and new; another tool at that step is a
change too), *only in A* or *only in B*. A read-only tool's step is shown but never makes the
two runs differ: only side effects count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter

from exactcall._errors import UnknownTool
from exactcall._history import HistoryCall
from exactcall._model import Intent
from exactcall._tool import get_tool
from exactcall._wire import session_id_prefix
from exactcall.evidence._audit import _quote
from exactcall.evidence._replay import (
    ABSENT,
    arg_differences,
    change_text,
    load_history,
    recorded_calls,
)

__all__ = ["SESSION", "CallDiff", "StepDiff", "calls_of", "diff_calls"]

SESSION = "session:"
"""``session:ID``: the calls of an ``exactcall.session``."""


@dataclass
class StepDiff:
    step: str
    status: str
    """``same``, ``changed``, ``only_a`` or ``only_b``."""
    tool_a: str | None
    tool_b: str | None
    read_only: bool = False
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    """(argument, value in A, value in B); ``tool`` and ``version`` when those differ."""

    @property
    def counts(self) -> bool:
        """Whether this step makes the runs differ (a side effect that is not the same)."""
        return self.status != "same" and not self.read_only

    def line(self) -> str:
        ro = " (read-only)" if self.read_only else ""
        if self.status == "same":
            return f"  same     {self.step:<24} {self.tool_a}{ro}"
        if self.status == "only_a":
            return f"  only A   {self.step:<24} {self.tool_a}{ro}"
        if self.status == "only_b":
            return f"  only B   {self.step:<24} {self.tool_b}{ro}"
        what = "; ".join(change_text(*c) for c in self.changes)
        return f"  changed  {self.step:<24} {self.tool_b}{ro}: {what}"

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "tool_a": self.tool_a,
            "tool_b": self.tool_b,
            "read_only": self.read_only,
            "changes": [{"field": k, **_side("a", a), **_side("b", b)} for k, a, b in self.changes],
        }


@dataclass
class CallDiff:
    steps: list[StepDiff]

    @property
    def same(self) -> bool:
        """Every side-effecting call is the same in both runs."""
        return not any(s.counts for s in self.steps)

    def text(self) -> str:
        differ = sum(s.counts for s in self.steps)
        head = (
            "every side-effecting call is the same"
            if self.same
            else f"{differ} side-effecting call{'s differ' if differ != 1 else ' differs'}"
        )
        return "\n".join([f"{len(self.steps)} steps: {head}", *(s.line() for s in self.steps)])


Call = Intent | HistoryCall
"""A run's call: its intent, or as its history read it (which says whether it was a read)."""


def diff_calls(a: Sequence[Call], b: Sequence[Call]) -> CallDiff:
    """Match the calls of two runs by step, in call order (A's, then B's own steps)."""
    first_a, first_b = _by_step(a), _by_step(b)
    read_a, read_b = _read_steps(a), _read_steps(b)
    order = list(first_a) + [s for s in first_b if s not in first_a]
    out = []
    for step in order:
        ia, ib = first_a.get(step), first_b.get(step)
        if ia is None or ib is None:
            status = "only_a" if ib is None else "only_b"
            reads = read_a if ib is None else read_b
            tool_a, tool_b = ia.tool if ia else None, ib.tool if ib else None
            out.append(StepDiff(step, status, tool_a, tool_b, read_only=reads[step]))
            continue
        changes: list[tuple[str, Any, Any]] = []
        if ia.tool != ib.tool:
            changes.append(("tool", ia.tool, ib.tool))
        if ia.tool_version != ib.tool_version:
            changes.append(("version", ia.tool_version, ib.tool_version))
        changes += arg_differences(ia.args, ib.args)
        status = "changed" if changes else "same"
        read_only = read_a[step] and read_b[step]
        out.append(StepDiff(step, status, ia.tool, ib.tool, read_only, changes))
    return CallDiff(out)


def _intent(c: Call) -> Intent:
    return c.intent if isinstance(c, HistoryCall) else c


def _by_step(calls: Sequence[Call]) -> dict[str, Intent]:
    """The first intent of each step (a settling attempt after a cancel repeats it)."""
    out: dict[str, Intent] = {}
    for c in calls:
        out.setdefault(_intent(c).step, _intent(c))
    return out


def _read_steps(calls: Sequence[Call]) -> dict[str, bool]:
    """Whether each step's first call was a read: as its history says, or (histories from
    before it said so, and plain intents) as the tool, if importable here, declares."""
    out: dict[str, bool] = {}
    for c in calls:
        if _intent(c).step not in out:
            said = c.read if isinstance(c, HistoryCall) else None
            out[_intent(c).step] = _reads(_intent(c)) if said is None else said
    return out


def _reads(i: Intent) -> bool:
    try:
        return bool(get_tool(i.tool).options.read_only)
    except UnknownTool:  # not importable here: counted as a side effect
        return False


async def calls_of(
    source: Any, conv: DataConverter, client: Client | None = None
) -> Sequence[Call]:
    """The calls of one run: a list of intents, a ``WorkflowHistory``, a history JSON file,
    or (with ``client``) a workflow id, ``ID:RUN_ID`` or ``session:ID``."""
    if isinstance(source, list):
        return list(source)
    if isinstance(source, WorkflowHistory):
        return await recorded_calls(source, conv)
    text = str(source)
    path = Path(text)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"{text}: no such history file")
        try:
            history = load_history(path)
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(
                f"{text} is not a workflow history (temporal workflow show --output json, or "
                f"exactcall history export): {type(exc).__name__}: {exc}"
            ) from None
        return await recorded_calls(history, conv)
    if client is None:
        raise ValueError(f"{text}: a workflow id needs a server (--address)")
    if text.startswith(SESSION):
        return await _session_calls(text[len(SESSION) :], conv, client)
    wid, _, run_id = text.partition(":")
    handle = client.get_workflow_handle(wid, run_id=run_id or None)
    return await recorded_calls(await handle.fetch_history(), conv)


async def _session_calls(session: str, conv: DataConverter, client: Client) -> list[Call]:
    """The calls of an ``exactcall.session``: one per call workflow of that session."""
    prefix = _quote(session_id_prefix(session) + "/")
    out: list[Call] = []
    async for ex in client.list_workflows(f"WorkflowId STARTS_WITH {prefix}"):
        handle = client.get_workflow_handle(ex.id, run_id=ex.run_id)
        out += await recorded_calls(await handle.fetch_history(), conv)
    if not out:
        raise ValueError(f"session {session!r} has no calls on this server")
    return out


def _side(name: str, value: Any) -> dict[str, Any]:
    return {f"{name}_absent": True} if value is ABSENT else {name: value}
