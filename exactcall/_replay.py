"""Replay stored histories against the current code, and check every call's intent too.

Temporal's Replayer catches a changed sequence of commands, but it does not compare activity
inputs: a change that moves a call's step, key or arguments replays cleanly and then causes a
duplicate effect after the deploy. This replays each history with an interceptor that captures
the intents the current code schedules, and compares them with the intents recorded in the
history (tool, args hash, step, key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
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

from ._model import Intent

__all__ = ["ReplayReport", "load_history", "recorded_intents", "replay_histories"]

_SEEN: list[Intent] = []


@dataclass
class ReplayReport:
    path: str
    workflow_id: str
    namespace: str
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    calls: int = 0


def load_history(path: str | Path) -> WorkflowHistory:
    """A history from ``temporal workflow show -o json`` or ``exactcall history export``."""
    raw = json.loads(Path(path).read_text())
    first = raw["events"][0]
    attrs = first.get("workflowExecutionStartedEventAttributes", {})
    wid = attrs.get("workflowId") or Path(path).stem
    return WorkflowHistory.from_json(wid, raw)


async def recorded_intents(history: WorkflowHistory, conv: DataConverter) -> list[Intent]:
    """The intents scheduled in a history, in order (activity inputs that are intents)."""
    out: list[Intent] = []
    for ev in history.events:
        if ev.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        payloads = ev.activity_task_scheduled_event_attributes.input.payloads
        if len(payloads) != 1:
            continue
        try:
            # decoded without a type hint, then validated: a converter with a lenient fallback
            # (the OpenAI Agents SDK's) would "decode" any activity input as an Intent
            [value] = await conv.decode(payloads)
            intent = Intent.model_validate(value)
        except Exception:
            continue  # a plain Temporal activity
        out.append(intent)
    return out


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
        if len(input.args) == 1 and isinstance(input.args[0], Intent):
            _SEEN.append(input.args[0])
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
    from ._plugin import Plugin

    given = list(plugins or [])
    ours = [p for p in given if isinstance(p, Plugin)] or [Plugin(tools=[])]
    plugins = [p for p in given if not isinstance(p, Plugin)] + ours
    conv = _converter(plugins)
    reports = []
    for path in paths:
        history = load_history(path)
        recorded = await recorded_intents(history, conv)
        ns = namespace or (recorded[0].namespace if recorded else "default")
        report = ReplayReport(str(path), history.workflow_id, ns, calls=len(recorded))
        replayer = Replayer(
            workflows=list(workflows), plugins=plugins, namespace=ns, interceptors=[_Capture()]
        )
        _SEEN.clear()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            report.ok = False
            report.problems.append(f"nondeterminism: {result.replay_failure}")
        report.problems += _drift(recorded, list(_SEEN))
        report.ok = report.ok and not report.problems
        reports.append(report)
    return reports


def _converter(plugins: Sequence[Any]) -> DataConverter:
    """The data converter the Replayer ends up with, to decode the recorded intents."""
    from ._plugin import Plugin, choose_data_converter

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


def _drift(recorded: list[Intent], replayed: list[Intent]) -> list[str]:
    problems = []
    for i, (old, new) in enumerate(zip(recorded, replayed, strict=False)):
        for name in ("tool", "step", "args_hash", "key"):
            before, after = getattr(old, name), getattr(new, name)
            if before != after:
                problems.append(
                    f"intent drift at call {i + 1} ({old.tool} {old.step}): {name} was "
                    f"{before!r}, the current code gives {after!r}"
                )
    if len(replayed) < len(recorded) and not problems:
        problems.append(
            f"the current code scheduled {len(replayed)} of the {len(recorded)} recorded calls"
        )
    return problems
