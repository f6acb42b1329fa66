"""``exactcall.testing.recorded_tools``: a worker on which every exactcall call is answered from
a recorded run instead of running its tool.

The recording is a run's history (a ``WorkflowHistory``, or a JSON file as ``temporal workflow
show --output json`` and ``exactcall history export`` write it). Its calls are read with
``_calls.calls_in_history``: no workflow code, no provider. A call is matched by its step: the
same tool and the same canonical arguments get the recorded result (or the recorded failure,
raised again as it was); anything else raises ``NotRecorded`` in the workflow, naming what
differs. The interception sits in front of exactcall's tool activity: the tool, its run claim
and its record are never reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from temporalio import activity
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from exactcall._calls import RunCall, calls_in_history
from exactcall._errors import ExactcallError, UnknownTool, register_error
from exactcall._model import Intent, WireIntent
from exactcall._tool import get_tool
from exactcall.evidence._replay import arg_differences, change_text, load_history

__all__ = ["NotRecorded", "RecordedTools", "recorded_tools"]


@register_error
class NotRecorded(ExactcallError):
    """The call is not in the recorded run (another step, tool or arguments): nothing ran."""

    code = "NotRecorded"


def recorded_tools(
    history: WorkflowHistory | str | Path | Sequence[WorkflowHistory | str | Path],
    *,
    reads: Literal["recorded", "live"] = "recorded",
    data_converter: DataConverter | None = None,
) -> RecordedTools:
    """A worker plugin that answers exactcall calls from the recorded run ``history``.

    ``reads="live"`` runs read-only tools for real (the recording is not consulted for them);
    ``"recorded"`` serves them from the recording too. ``data_converter``: the one the run was
    recorded with (default: exactcall's). Several histories: their calls are matched by step
    together (a step recorded twice is bad input)."""
    if reads not in ("recorded", "live"):
        raise ValueError(f"reads={reads!r}: use 'recorded' or 'live'")
    many = history if isinstance(history, Sequence) and not isinstance(history, str) else [history]
    return RecordedTools([_load(h) for h in many], reads, data_converter)


def _load(h: WorkflowHistory | str | Path) -> WorkflowHistory:
    if isinstance(h, WorkflowHistory):
        return h
    path = Path(h)
    if not path.is_file():
        raise ValueError(f"{h}: no such history file")
    try:
        return load_history(path)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(
            f"{h} is not a workflow history (temporal workflow show --output json, or "
            f"exactcall history export): {type(exc).__name__}: {exc}"
        ) from None


class RecordedTools(SimplePlugin):
    """The plugin ``recorded_tools`` returns: give it to a ``Worker(plugins=[...])``."""

    def __init__(
        self,
        histories: list[WorkflowHistory],
        reads: str,
        data_converter: DataConverter | None,
    ) -> None:
        self.histories = histories
        self.reads = reads
        self._conv = data_converter
        self._calls: dict[str, RunCall] | None = None
        self._lock = asyncio.Lock()
        self.served: list[str] = []
        """Steps answered from the recording, in order."""
        self.refused: list[str] = []
        """Why each call that was not in the recording was refused."""
        super().__init__("exactcall.recorded_tools", interceptors=[_Interceptor(self)])

    async def calls(self) -> dict[str, RunCall]:
        """The recorded calls by step (read from the histories once)."""
        async with self._lock:
            if self._calls is None:
                from exactcall._plugin import choose_data_converter

                conv = self._conv or choose_data_converter(DataConverter.default)
                out: dict[str, RunCall] = {}
                for h in self.histories:
                    for c in await calls_in_history(h, conv):
                        if c.step in out and out[c.step].key != c.key:
                            raise ValueError(
                                f"step {c.step!r} is recorded twice ({h.workflow_id} and "
                                f"{out[c.step].workflow_id}): give one run per recorded_tools"
                            )
                        out[c.step] = c
                self._calls = out
            return self._calls

    @property
    def unused(self) -> list[str]:
        """Recorded steps that no call asked for (so far)."""
        return [s for s in (self._calls or {}) if s not in self.served]

    async def answer(self, intent: Intent) -> Any:
        calls = await self.calls()
        rec = calls.get(intent.step)
        if rec is None:
            have = ", ".join(sorted(calls)) or "none"
            self._refuse(
                intent,
                f"{intent.tool} {intent.step} is not in the recorded run (its steps: {have})",
            )
        assert rec is not None
        changes = []
        if rec.tool != intent.tool:
            changes.append(change_text("tool", rec.tool, intent.tool))
        changes += [change_text(*d) for d in arg_differences(rec.args, intent.args)]
        if changes:
            self._refuse(
                intent,
                f"{intent.tool} {intent.step} differs from the recorded call: "
                + "; ".join(changes),
            )
        if rec.outcome == "done":
            self.served.append(intent.step)
            if rec.result is None:
                return rec.settled_result
            conv = self._conv or DataConverter.default
            return conv.payload_converter.from_payload(rec.result)
        if rec.outcome == "failed" and rec.error_type:
            self.served.append(intent.step)
            details = list(rec.error_details)
            if details and isinstance(details[0], dict):  # this call's key, not the recording's
                details[0] = {**details[0], "key": intent.key, "step": intent.step}
            raise ApplicationError(
                rec.error or f"{intent.tool} failed",
                *details,
                type=rec.error_type,
                non_retryable=True,
            )
        self._refuse(
            intent,
            f"{intent.tool} {intent.step} has no recorded result to give: its recorded outcome "
            f"is {rec.outcome}",
        )

    def _refuse(self, intent: Intent, message: str) -> None:
        self.refused.append(message)
        raise NotRecorded(
            message + "; nothing ran",
            tool=intent.tool,
            step=intent.step,
            args_hash=intent.args_hash,
        )


class _Interceptor(Interceptor):
    def __init__(self, plugin: RecordedTools) -> None:
        self.plugin = plugin

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self.plugin)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, plugin: RecordedTools) -> None:
        super().__init__(next)
        self.plugin = plugin

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        intent = input.args[0] if len(input.args) == 1 else None
        if isinstance(intent, WireIntent):  # a tool activity's input: the intent, completed
            info = activity.info()
            workflow_type = info.workflow_type or ""
            intent = intent.complete(workflow_type=workflow_type, task_queue=info.task_queue)
        if not isinstance(intent, Intent) or not self._guarded(intent):
            return await super().execute_activity(input)
        if intent.tool != activity.info().activity_type:
            return await super().execute_activity(input)  # a probe, or another exactcall activity
        return await self.plugin.answer(intent)

    def _guarded(self, intent: Intent) -> bool:
        try:
            t = get_tool(intent.tool)
        except UnknownTool:
            return False
        return not (self.plugin.reads == "live" and t.options.read_only)
