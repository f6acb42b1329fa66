"""``exactcall mcp proxy`` (issue 33 §4): the approval wait bounds how long a client is held,
a write over the size limit names the proxy's flag, a call left unknown by a killed proxy is
listed and settled with no proxy running, a person's plain value becomes the tool's result,
and ``--home`` is the proxy's state folder. Real processes: the MCP SDK's stdio client, the
proxy, the server of tests/mcp_proxy_servers.py, a real Temporal dev server."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from exactcall._cli import main as cli_main
from exactcall._server import DevServer
from tests.mcp_proxy_client import OUTCOME, fresh, meta, proxied, text


async def test_the_approval_wait_bounds_how_long_the_client_is_held(
    server: DevServer, tmp_path: Path
) -> None:
    """--approval-wait 3: the client gets the tool error that says how to approve within
    about 3 s (it was held for the workflow's whole first wait slice, 30 s)."""
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    flags = ("--approve", "append", "--approval-wait", "3")
    async with proxied(tmp_path, *flags, name=fresh(), address=server.address) as p:
        t0 = time.monotonic()
        waiting = await p.client.call_tool("append", {"line": "x"}, progress_callback=on_progress)
        took = time.monotonic() - t0
    assert waiting.is_error and meta(waiting)[OUTCOME] == "awaiting_approval", text(waiting)
    assert "exactcall approve" in text(waiting) and progress and "exactcall approve" in progress[0]
    assert took < 20, f"held {took:.1f} s with --approval-wait 3"
    assert p.count("append") == 0


async def test_a_write_over_the_size_limit_names_the_proxy_flag_that_raises_it(
    server: DevServer, tmp_path: Path
) -> None:
    big = {"line": "x" * (300 * 1024)}  # canonical arguments over the default 256 KiB
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        refused = await p.client.call_tool("append", big)
    assert refused.is_error and meta(refused)[OUTCOME] == "denied", text(refused)
    assert "--max-args-bytes" in text(refused) and "nothing was sent" in text(refused)
    assert "max_args_bytes=" not in text(refused)  # a proxy user has no tool to give it to
    assert p.count("append") == 0
    async with proxied(
        tmp_path, "--max-args-bytes", "1MiB", name=fresh(), address=server.address
    ) as p2:
        sent = await p2.client.call_tool("append", big)
    assert not sent.is_error, text(sent)[:500]
    assert p2.count("append") == 1


def test_a_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mcp", "proxy", "--max-args-bytes", "lots", "--", sys.executable]
    assert cli_main(argv) == 2
    assert "'lots' is not a size" in capsys.readouterr().err
