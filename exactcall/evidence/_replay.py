"""Replay stored histories against the current code, and check every call's intent too.

Temporal's Replayer catches a changed sequence of commands, but it does not compare activity
inputs: a change that moves a call's step, key or arguments replays cleanly and then causes a
duplicate effect after the deploy. This replays each history with an interceptor that captures
the intents the current code schedules, and compares them with the intents recorded in the
history (tool, args hash, step, key).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import (
    Interceptor,
    Replayer,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from exactcall._history import HistoryCall, read_history
from exactcall._model import Intent, WireIntent
from exactcall._tool import registered_tools

__all__ = ["ReplayReport", "load_history", "recorded_intents", "replay_histories"]

log = structlog.get_logger("exactcall")

_SEEN: list[Intent] = []


@dataclass
class ReplayReport:
    path: str
    workflow_id: str
    namespace: str
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    calls: int = 0
    notes: list[str] = field(default_factory=list)
    """What changed without changing a call's identity (a parameter added with a default)."""


def load_history(path: str | Path) -> WorkflowHistory:
    """A history from ``temporal workflow show -o json`` or ``exactcall history export``."""
    raw = json.loads(Path(path).read_text())
    first = raw["events"][0]
    attrs = first.get("workflowExecutionStartedEventAttributes", {})
    wid = attrs.get("workflowId") or Path(path).stem
    return WorkflowHistory.from_json(wid, raw)


async def recorded_intents(
    history: WorkflowHistory, conv: DataConverter, *, problems: list[str] | None = None
) -> list[Intent]:
    """The intents scheduled in a history, in order (activity inputs that are intents).

    An activity whose input is not an intent is a plain Temporal activity and is skipped. One
    that looks like an exactcall call (its type is an exactcall tool or activity, or its input
    is JSON with an intent's fields) but does not decode as an Intent is a problem: appended to
    ``problems`` when given, else logged as ``replay.intent_undecodable``; never hidden."""
    return [c.intent for c in await recorded_calls(history, conv, problems=problems)]


async def recorded_calls(
    history: WorkflowHistory, conv: DataConverter, *, problems: list[str] | None = None
) -> list[HistoryCall]:
    """The calls scheduled in a history, in order, as ``recorded_intents`` reads them."""
    tools = [t.name for t in registered_tools()]
    run = await read_history(history.events, conv, tools=tools)
    for problem in run.problems:
        if problems is None:
            log.warning(
                "replay.intent_undecodable", workflow_id=history.workflow_id, problem=problem
            )
        else:
            problems.append(problem)
    return run.calls


class _Capture(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _CaptureInbound


class _CaptureInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_CaptureOutbound(outbound))


class _CaptureOutbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        arg = input.args[0] if len(input.args) == 1 else None
        if isinstance(arg, WireIntent):  # a tool activity's input: the intent, completed
            info = workflow.info()
            queue = input.task_queue or info.task_queue
            arg = arg.complete(workflow_type=info.workflow_type, task_queue=queue)
        if isinstance(arg, Intent):
            _SEEN.append(arg)
        return super().start_activity(input)


async def replay_histories(
    paths: Sequence[str | Path],
    workflows: Sequence[type],
    *,
    namespace: str | None = None,
    plugins: Sequence[Any] | None = None,
) -> list[ReplayReport]:
    """Replay each file; report nondeterminism and intent drift per file.

    ``plugins``: exactcall's (one is added when none is given) and any others the workflows
    ran with (an agent framework's). A Replayer does not show its plugin list to a plugin, so
    the others are put first: a plugin that insists on its own payload converter then sets it
    before exactcall checks that it carries pydantic models."""
    from exactcall._plugin import Plugin

    given = list(plugins or [])
    ours = [p for p in given if isinstance(p, Plugin)] or [Plugin(tools=[])]
    plugins = [p for p in given if not isinstance(p, Plugin)] + ours
    conv = _converter(plugins)
    reports = []
    for path in paths:
        history = load_history(path)
        undecodable: list[str] = []
        recorded = await recorded_intents(history, conv, problems=undecodable)
        ns = namespace or (recorded[0].namespace if recorded else "default")
        report = ReplayReport(str(path), history.workflow_id, ns, calls=len(recorded))
        report.problems += undecodable
        replayer = Replayer(
            workflows=list(workflows), plugins=plugins, namespace=ns, interceptors=[_Capture()]
        )
        _SEEN.clear()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            report.ok = False
            report.problems.append(f"nondeterminism: {result.replay_failure}")
        report.problems += _drift(recorded, list(_SEEN), report.notes)
        report.ok = report.ok and not report.problems
        reports.append(report)
    return reports


def _converter(plugins: Sequence[Any]) -> DataConverter:
    """The data converter the Replayer ends up with, to decode the recorded intents."""
    from exactcall._plugin import Plugin, choose_data_converter

    conv = DataConverter.default
    for p in plugins:
        dc = getattr(p, "data_converter", None)
        if isinstance(p, Plugin):
            conv = choose_data_converter(conv)
        elif callable(dc):
            conv = dc(conv)
        elif isinstance(dc, DataConverter):
            conv = dc
    return conv


def _drift(recorded: list[Intent], replayed: list[Intent], notes: list[str]) -> list[str]:
    problems = []
    for i, (old, new) in enumerate(zip(recorded, replayed, strict=False)):
        where = f"call {i + 1} ({old.tool} {old.step})"
        for name in ("tool", "step", "key"):
            before, after = getattr(old, name), getattr(new, name)
            if before != after:
                problems.append(
                    f"intent drift at {where}: {name} was {before!r}, the current code gives "
                    f"{after!r}"
                )
        if old.args_hash == new.args_hash or old.tool != new.tool:
            continue
        if _same_call(old, new):
            added = [f"{k}={shown(v)}" for k, v in new.args.items() if k not in old.args]
            notes.append(
                f"{where}: the tool gained {', '.join(added)}, which the call leaves at the "
                "default, so it is the same call (its recorded result, approval and key hold)"
            )
            continue
        changes = _arg_changes(old.args, new.args)
        problems.append(
            f"intent drift at {where}: {'; '.join(changes)} (args hash {old.args_hash[:12]} "
            f"recorded, {new.args_hash[:12]} now): a run that reaches this call again (a "
            "reset, a re-run) gets IntentConflict. Keep the old arguments for runs started "
            "before the change (workflow.patched) or drain them; only a parameter added with a "
            "default keeps a call's identity"
        )
    if len(replayed) < len(recorded) and not problems:
        problems.append(
            f"the current code scheduled {len(replayed)} of the {len(recorded)} recorded calls"
        )
    return problems


def _same_call(old: Intent, new: Intent) -> bool:
    from exactcall._errors import UnknownTool
    from exactcall._tool import get_tool

    try:
        t = get_tool(new.tool)
    except UnknownTool:  # the replayed code's tool is not registered here: hashes alone
        return False
    return t.same_call(old.args_hash, new.args)


def arg_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Each argument that differs: ``(name, old, new)``, with ``ABSENT`` where one lacks it."""
    out = []
    for name in [*old, *(k for k in new if k not in old)]:
        before, after = old.get(name, ABSENT), new.get(name, ABSENT)
        if before != after:
            out.append((name, before, after))
    return out


def change_text(name: str, before: Any, after: Any) -> str:
    return f"{name}: {shown(before)} -> {shown(after)}"


def _arg_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [change_text(*d) for d in arg_differences(old, new)]


ABSENT: Any = object()
"""An argument one side of a comparison lacks."""


def shown(value: Any) -> str:
    """A value as a short line of JSON (``(absent)`` for ``ABSENT``)."""
    if value is ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
