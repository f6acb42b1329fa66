"""Two apps with a tool of one name share a process when each worker lists its tools
(issue 21 item 7). Run in a process of its own: once both apps are imported, a plain
exactcall.Plugin() (this session's client) rightly refuses to build workers."""

from __future__ import annotations

import subprocess
import sys

from exactcall.embedded._server import DevServer
from tests.conftest import ROOT


def test_each_worker_resolves_a_shared_name_to_its_own_tool(server: DevServer) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.two_apps.check", server.address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    checks = [line[6:] for line in proc.stdout.splitlines() if line.startswith("CHECK ")]
    assert checks == [
        "scoped: ok",
        "ambiguous name: refused",
        "Plugin() with both: refused",
        "one list with both: refused",
    ], proc.stdout
