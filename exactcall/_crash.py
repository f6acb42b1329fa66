"""Crash points for crash tests: kill this worker process with SIGKILL at a named point.

Set ``EXACTCALL_CRASH_AT`` to a comma-separated list of ``tool:point[:attempt]`` (``*`` for
any tool) before the worker starts. Points:

* ``before_claim``: nothing of this attempt is written yet (the call surely did not happen);
* ``in_call``: the record is claimed and the pre-call heartbeat written, the tool is not
  called yet (from outside, the call may have happened);
* ``after_call``: the tool returned, its result is not recorded yet;
* ``after_record``: the result is recorded, the activity has not completed yet.

Unset, it costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["CRASH_ENV", "POINTS", "maybe_crash"]

CRASH_ENV = "EXACTCALL_CRASH_AT"
POINTS = ("before_claim", "in_call", "after_call", "after_record")


def _parse(spec: str) -> list[tuple[str, str, int | None]]:
    rules: list[tuple[str, str, int | None]] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[1] not in POINTS:
            raise ValueError(
                f"{CRASH_ENV}={spec!r}: expected tool:point[:attempt] with point in {POINTS}"
            )
        rules.append((parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None))
    return rules


def maybe_crash(point: str, tool: str, attempt: int) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    for t, p, a in _parse(spec):
        if p == point and t in ("*", tool) and a in (None, attempt):
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
