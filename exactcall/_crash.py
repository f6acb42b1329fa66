"""Crash points for crash tests: kill this worker process with SIGKILL at a named point.

Set ``EXACTCALL_CRASH_AT`` to a comma-separated list of ``tool:point[:attempt]`` (``*`` for
any tool) before the worker starts. Points:

* ``before_claim``: nothing of this attempt is written yet (the call surely did not happen);
* ``in_call``: the record is claimed and the pre-call heartbeat written, the tool is not
  called yet (from outside, the call may have happened);
* ``after_call``: the tool returned, its result is not recorded yet;
* ``after_record``: the result is durable: the attempt that claimed the record completed its
  activity with it (the completion is the done marker), any other attempt wrote ``done`` to
  the record and has not completed yet;
* ``in_probe``: inside the reconciliation probe of the tool.

``tool@step:point`` limits a rule to one call (``pay@pay#2:after_call:1``).

The points are armed only in a worker that has :class:`CrashPlugin` (its activity interceptor
marks each activity it runs): the test kit's :class:`exactcall.testing.WorkerProcess` and
``exactcall crashtest`` add it (``exactcall worker --plugin exactcall._crash:CrashPlugin``). In
any other worker, a production one, :func:`maybe_crash` never kills: with ``EXACTCALL_CRASH_AT``
set it logs ``crash.points_not_armed`` once and carries on.

Unarmed, it costs one context-variable lookup.
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

import structlog
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = [
    "CRASH_ENV",
    "CRASH_PLUGIN",
    "EXECUTIONS_ENV",
    "POINTS",
    "CrashInterceptor",
    "CrashPlugin",
    "armed_in",
    "maybe_crash",
    "note_execution",
    "warn_if_unarmed",
]

log = structlog.get_logger("exactcall")

CRASH_ENV = "EXACTCALL_CRASH_AT"
EXECUTIONS_ENV = "EXACTCALL_EXECUTIONS_FILE"
POINTS = ("before_claim", "in_call", "after_call", "after_record", "in_probe")
CRASH_PLUGIN = "exactcall._crash:CrashPlugin"
"""``exactcall worker --plugin`` value that arms the crash points (test kit and crashtest)."""

_ARMED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "exactcall_crash_armed", default=False
)
_warned = False


class _ArmedActivity(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        token = _ARMED.set(True)
        try:
            return await self.next.execute_activity(input)
        finally:
            _ARMED.reset(token)


class CrashInterceptor(Interceptor):
    """Arms the crash points for the duration of each activity of the worker it is on."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ArmedActivity(next)


class CrashPlugin(SimplePlugin):
    """A Temporal plugin for test workers only: arms ``EXACTCALL_CRASH_AT``'s crash points."""

    def __init__(self) -> None:
        super().__init__("exactcall.crash", interceptors=[CrashInterceptor()])


def armed_in(interceptors: Iterable[object]) -> bool:
    """True if a worker with these interceptors arms the crash points."""
    return any(isinstance(i, CrashInterceptor) for i in interceptors)


def warn_if_unarmed(interceptors: Iterable[object]) -> None:
    """At worker start: say so if EXACTCALL_CRASH_AT is set where it does nothing."""
    global _warned
    if os.environ.get(CRASH_ENV) and not armed_in(interceptors) and not _warned:
        _warned = True
        _warn_unarmed()


def _warn_unarmed() -> None:
    log.warning(
        "crash.points_not_armed",
        env=CRASH_ENV,
        spec=os.environ.get(CRASH_ENV),
        reason="this worker does not have exactcall's CrashPlugin (test kit and crashtest "
        "workers only), so crash points never kill it",
        fix=f"unset {CRASH_ENV} in production; for a crash test run the worker with "
        f"--plugin {CRASH_PLUGIN} (exactcall.testing.WorkerProcess does)",
    )


def _parse(spec: str) -> list[tuple[str, str, int | None]]:
    rules: list[tuple[str, str, int | None]] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[1] not in POINTS:
            raise ValueError(
                f"{CRASH_ENV}={spec!r}: expected tool[@step]:point[:attempt] with point in {POINTS}"
            )
        rules.append((parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None))
    return rules


def maybe_crash(point: str, tool: str, attempt: int, step: str | None = None) -> None:
    """SIGKILL this process if an EXACTCALL_CRASH_AT rule matches and the points are armed
    (in an activity of a worker with :class:`CrashPlugin`); otherwise a no-op."""
    global _warned
    if not _ARMED.get():
        if not _warned and os.environ.get(CRASH_ENV):
            _warned = True
            _warn_unarmed()
        return
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    for t, p, a in _parse(spec):
        name, _, at_step = t.partition("@")
        if at_step and at_step != step:
            continue
        if p == point and name in ("*", tool) and a in (None, attempt):
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def note_execution(tool: str, step: str, key: str, attempt: int, workflow_id: str) -> None:
    """Append one line per entry into a tool's body to $EXACTCALL_EXECUTIONS_FILE, if set.

    One O_APPEND write before the body runs: it survives a SIGKILL at any later point. Used by
    ``exactcall crashtest`` to count real executions per call.
    """
    path = os.environ.get(EXECUTIONS_ENV)
    if not path:
        return
    line = json.dumps(
        {"tool": tool, "step": step, "key": key, "attempt": attempt, "workflow_id": workflow_id}
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
