"""The embedded dev server (``exactcall.embedded._server.DevServer``): what it leaves behind,
and what it says when it cannot start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from exactcall.embedded._server import DevServer


def _logs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("exactcall-temporal-*"))


def test_a_server_whose_owner_is_killed_leaves_no_log_file() -> None:
    before = _logs()
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom exactcall.embedded._server import DevServer\n"
            "s = DevServer().start()\nprint(s.pid, flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert owner.stdout is not None
    server_pid = int(owner.stdout.readline())
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _logs() - before == set()  # its output went to a file without a name
    finally:
        owner.stdout.close()
        os.kill(server_pid, signal.SIGKILL)  # (its own session: it outlives its owner)
    with DevServer() as s:
        assert s.address
    assert _logs() - before == set()


def test_a_server_that_cannot_start_says_why() -> None:
    bad = DevServer(extra_args=("--no-such-flag",))
    with pytest.raises(RuntimeError, match="start-dev exited") as err:
        bad.start()
    assert "unknown flag: --no-such-flag" in str(err.value)  # the server's own words


def test_restart_needs_a_database_file_and_a_first_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs db=: a server without a database file loses"):
        DevServer(port=7233).restart()
    with pytest.raises(ValueError, match="never started: call start"):
        DevServer(db=tmp_path / "t.db").restart()
