"""Crash points for crash tests: kill this worker process with SIGKILL at a named point.

Set ``EXACTCALL_CRASH_AT`` to a comma-separated list of ``tool:point[:attempt]`` (``*`` for
any tool) before the worker starts. Points:

* ``before_claim``: nothing of this attempt is written yet (the call surely did not happen);
* ``in_call``: the record is claimed and the pre-call heartbeat written, the tool is not
  called yet (from outside, the call may have happened);
* ``after_call``: the tool returned, its result is not recorded yet;
* ``after_record``: the result is recorded, the activity has not completed yet;
* ``in_probe``: inside the reconciliation probe of the tool.

``tool@step:point`` limits a rule to one call (``pay@pay#2:after_call:1``).

Unset, it costs one environment lookup.
"""

from __future__ import annotations

import json
import os
import signal
import sys

__all__ = ["CRASH_ENV", "EXECUTIONS_ENV", "POINTS", "maybe_crash", "note_execution"]

CRASH_ENV = "EXACTCALL_CRASH_AT"
EXECUTIONS_ENV = "EXACTCALL_EXECUTIONS_FILE"
POINTS = ("before_claim", "in_call", "after_call", "after_record", "in_probe")


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
