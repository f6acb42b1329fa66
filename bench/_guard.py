"""Stop an embedded dev server even if the bench process dies without cleaning up.

``DevServer`` starts ``temporal server start-dev`` in its own session, so it outlives a bench
process that segfaults (temporalio sdk-python #300: a process that ran a worker can crash,
seen here during worker shutdown). ``watch(pid)`` starts a tiny watchdog that sends SIGTERM
to the server's process group once this process is gone; after a normal run the server is
already stopped and the watchdog just exits (within ``POLL`` seconds of this process).
"""

from __future__ import annotations

import subprocess
import sys

POLL = 0.5

_WATCHDOG = """
import os, signal, sys, time
parent, server = int(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
while os.getppid() == parent:
    time.sleep(float(sys.argv[3]))
try:
    with open(f"/proc/{server}/cmdline", "rb") as f:
        if b"start-dev" in f.read():
            os.killpg(server, signal.SIGTERM)
except OSError:
    pass
"""


def watch(server_pid: int | None) -> None:
    """Start the watchdog for the server ``server_pid`` (no-op for None)."""
    if server_pid is None:
        return
    import os

    subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(server_pid), str(POLL)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
