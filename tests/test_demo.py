"""``exactcall demo``: run as a user would, end to end, with real worker processes killed."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest

from exactcall._server import DevServer

pytestmark = pytest.mark.crash

TIMEOUT = 120.0
ROWS = {
    "plain Temporal activity": (2, "paid twice"),
    "exactcall (bank dedupes the key)": (1, "done: re-sent with the same key"),
    "exactcall (crash inside the call)": (1, "unknown: not re-sent"),
}


async def run_demo(*args: str) -> tuple[int, str]:
    env = {**os.environ}
    for name in ("EXACTCALL_CRASH_AT", "EXACTCALL_DEMO_CRASH_BARE"):
        env.pop(name, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "demo",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"exactcall demo did not finish within {TIMEOUT:.0f} s:\n{out.decode()}")
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def assert_table(out: str) -> None:
    for label, (payments, note) in ROWS.items():
        row = re.search(rf"^\s+{re.escape(label)}\s+payments: (\d+)\s+(.*)$", out, re.MULTILINE)
        assert row, f"no row for {label!r}:\n{out}"
        assert int(row.group(1)) == payments, out
        assert row.group(2).startswith(note), out
    assert re.search(r"^finished in \d+\.\d s$", out, re.MULTILINE), out


async def test_demo_starts_the_embedded_server() -> None:
    code, out = await run_demo("--address", "127.0.0.1:1")
    assert code == 0, out
    assert "No Temporal server at 127.0.0.1:1: started the embedded one on 127.0.0.1:" in out
    assert_table(out)
    assert "unknown: not re-sent" in out


async def test_demo_uses_a_running_server(server: DevServer) -> None:
    code, out = await run_demo("--address", server.address, "--namespace", "default")
    assert code == 0, out
    assert "embedded" not in out, out
    assert_table(out)
