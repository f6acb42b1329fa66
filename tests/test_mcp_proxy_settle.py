"""``exactcall mcp proxy`` (issue 33 §4): the approval wait bounds how long a client is held,
a write over the size limit names the proxy's flag, a call left unknown by a killed proxy is
listed and settled with no proxy running, a person's plain value becomes the tool's result,
and ``--home`` is the proxy's state folder. Real processes: the MCP SDK's stdio client, the
proxy, the server of tests/mcp_proxy_servers.py, a real Temporal dev server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from exactcall._canonical import derive_key
from exactcall.cli._main import main as cli_main
from exactcall.embedded._server import DevServer
from exactcall.mcp._proxy_workflow import MCP_PROXY_TOOL
from tests.mcp_proxy_client import (
    DEDUP,
    OUTCOME,
    ROOT,
    alive,
    eventually,
    fresh,
    meta,
    proxied,
    proxy_env,
    text,
)


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


def _exactcall(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m exactcall ARGS`` as a person runs it: no Temporal configured, the state
    folder in EXACTCALL_HOME (and ARGS)."""
    return subprocess.run(
        [sys.executable, "-m", "exactcall", *args],
        cwd=ROOT,
        env=proxy_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.crash
@pytest.mark.parametrize("verdict", ["--landed", "--not-landed"])
async def test_a_killed_proxys_call_is_listed_and_settled_with_no_proxy_running(
    tmp_path: Path, verdict: str
) -> None:
    """The proxy (on its embedded server) is SIGKILLed mid-write and its server stopped: no
    proxy and no server run. `exactcall unresolved` (given the server's old address, as the
    proxy printed it) starts the server on its database and lists the call, `exactcall resolve
    --landed --home` settles it (accepted), and the server stops with each command. A proxy
    of that name started later gives the client that verdict's result, nothing sent again.
    `--not-landed` is accepted as well, and the next proxy of that name sends the call once
    more, with the same key; the client's retry gets that result."""
    home, effects = tmp_path / "home", tmp_path / "k.effects"
    info = home / "mcp" / "temporal.json"
    args = {"line": "k", "seconds": 1.5}
    where = {"effects": effects, "home": home}
    try:
        with contextlib.suppress(Exception):  # the client's session dies with the proxy
            async with proxied(
                tmp_path, name="kept", address=None, effects=effects, home=home
            ) as p:
                pending = asyncio.create_task(p.client.call_tool("slow_append", args))
                await eventually(Path(f"{effects}.started").exists)
                os.killpg(p.pids()[1], signal.SIGKILL)  # the proxy and its server, mid-write
                await asyncio.wait({pending}, timeout=10)
        old = json.loads(info.read_text())
        os.kill(old["pid"], signal.SIGTERM)  # and the embedded server (a reboot, say)
        await eventually(lambda: not alive(old["pid"]), 20)

        # the address a proxy printed, now stale: the server is started again on its database
        stale = ["unresolved", "--json", "--address", old["address"]]
        listed = await asyncio.to_thread(_exactcall, home, *stale)
        assert listed.returncode == 0, listed.stderr
        rows = [r for r in json.loads(listed.stdout) if r["kind"] == "unknown_outcome"]
        assert [(r["tool"], r["args"]["tool"]) for r in rows] == [
            (MCP_PROXY_TOOL, "slow_append")
        ], listed.stderr
        wid, step = rows[0]["workflow_id"], rows[0]["step"]
        assert "embedded server" in listed.stderr
        assert not alive(json.loads(info.read_text())["pid"])  # stopped with the command

        given = ["--result", '"k written"'] if verdict == "--landed" else []
        decide = ["resolve", wid, step, verdict, *given, "--yes", "--home", str(home)]
        settled = await asyncio.to_thread(_exactcall, home, *decide)
        assert settled.returncode == 0, settled.stdout + settled.stderr
        assert "accepted" in settled.stdout
        after = await asyncio.to_thread(
            _exactcall, home, "unresolved", "--json", "--home", str(home)
        )
        assert [r for r in json.loads(after.stdout) if r["kind"] == "unknown_outcome"] == []
        assert not alive(json.loads(info.read_text())["pid"])

        async with proxied(tmp_path, name="kept", address=None, **where) as p2:
            if verdict == "--not-landed":  # the new proxy sends it, once, by itself
                await eventually(lambda: p2.count("slow_append") == 1)
            again = await p2.client.call_tool("slow_append", args)
    finally:
        with contextlib.suppress(Exception):
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    assert not again.is_error and meta(again)[DEDUP] is True, text(again)
    if verdict == "--landed":
        assert text(again).endswith("k written")
        assert p2.count("slow_append") == 0  # the person said it landed: never sent again
    else:
        assert p2.count("slow_append") == 1 and "slow_append k " in text(again)
        assert p2.keys("slow_append") == [derive_key("default", wid, step, MCP_PROXY_TOOL, "1")]


@pytest.mark.crash
async def test_a_plain_result_settles_a_tool_with_an_output_schema(
    server: DevServer, tmp_path: Path
) -> None:
    """The server dies during slow_save, whose output schema is {"content": string}; the
    person resolves it with a plain value, as the proxy's text says (`--landed --result JSON`);
    the copy gets a result the client accepts: that value, as the schema's one property."""
    effects, args = tmp_path / "save.effects", {"line": "s", "seconds": 5}
    async with proxied(tmp_path, name=fresh(), address=server.address, effects=effects) as p:
        pending = asyncio.create_task(p.client.call_tool("slow_save", args))
        await eventually(Path(f"{effects}.started").exists)
        os.kill(p.pids()[0], signal.SIGKILL)
        unknown = await asyncio.wait_for(pending, 30)
    assert unknown.is_error and meta(unknown)[OUTCOME] == "unknown"
    assert "--landed --result JSON | --not-landed | --abandon" in text(unknown)
    wid, step = meta(unknown)["io.exactcall/workflow-id"], meta(unknown)["io.exactcall/step"]
    landed = ["resolve", wid, step, "--landed", "--result", '"saved"', "--yes"]
    async with proxied(tmp_path, name=p.name, address=server.address, effects=effects) as p2:
        assert await asyncio.to_thread(cli_main, [*landed, "--address", server.address]) == 0
        copy = await p2.client.call_tool("slow_save", args)  # the client checks the schema
    assert not copy.is_error and meta(copy)[DEDUP] is True, text(copy)
    assert copy.structured_content == {"content": "saved"}
    assert p2.count("slow_save") == 0


async def test_home_is_the_proxys_state_folder_whatever_its_client_passes(
    tmp_path: Path,
) -> None:
    """An MCP client starts the proxy with the MCP SDK's default environment (HOME, PATH, ...,
    no EXACTCALL_HOME); --home puts its embedded server's database and its audit there."""
    home, effects = tmp_path / "state", tmp_path / "home.effects"
    info = home / "mcp" / "temporal.json"
    upstream = [sys.executable, "-m", "tests.mcp_proxy_servers", "effects", str(effects)]
    args = ["-m", "exactcall", "mcp", "proxy", "--name", "homed", "--home", str(home), "--"]
    params = StdioServerParameters(command=sys.executable, args=[*args, *upstream], cwd=ROOT)
    try:
        with (tmp_path / "homed.log").open("a") as log:
            async with Client(stdio_client(params, errlog=log), read_timeout_seconds=60) as c:
                done = await c.call_tool("append", {"line": "h"})
    finally:
        with contextlib.suppress(Exception):
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    assert not done.is_error, text(done)
    assert (home / "mcp" / "temporal.db").exists() and (home / "mcp" / "homed.audit.jsonl").exists()
    assert effects.read_text().startswith("append h ")
