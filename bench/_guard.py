"""Stop an embedded dev server even if the bench process dies without cleaning up.

``DevServer`` starts ``temporal server start-dev`` in its own session, so it outlives a bench
process that segfaults (temporalio sdk-python #300: a process that ran a worker can crash,
seen here during worker shutdown); so does a worker subprocess started in its own session.
``watch(pid)`` starts a tiny watchdog that sends SIGTERM to that process group once this
process is gone; after a normal run the child is already stopped and the watchdog just exits
(within ``POLL`` seconds of this process).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

POLL = 0.5

_WATCHDOG = """
import os, signal, sys, time
parent, server, marker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4].encode()
signal.signal(signal.SIGINT, signal.SIG_IGN)
while os.getppid() == parent:
    time.sleep(float(sys.argv[3]))
try:
    with open(f"/proc/{server}/cmdline", "rb") as f:
        if marker in f.read():
            os.killpg(server, signal.SIGTERM)
except OSError:
    pass
"""


def watch(pid: int | None, marker: bytes = b"start-dev") -> None:
    """Start the watchdog for the process group led by ``pid`` (no-op for None): SIGTERM once
    this process is gone, if ``pid`` is still a process whose command line holds ``marker``."""
    if pid is None:
        return
    import os

    argv = [str(os.getpid()), str(pid), str(POLL), marker.decode()]
    subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def run_main(amain: Callable[[], Coroutine[Any, Any, int]]) -> NoReturn:
    """Run a bench's ``amain()`` and exit with its code (2 for a usage error, 130 for Ctrl-C,
    1 for a crash, printed), by ``os._exit``: temporalio sdk-python #300, a process that ran a
    worker can crash at interpreter exit."""
    code = 1
    try:
        code = asyncio.run(amain())
    except SystemExit as exc:  # --help, or a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        code = 130
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
