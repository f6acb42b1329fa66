"""The proxy and Streamable HTTP: ``exactcall mcp proxy --url`` (a stdio client in front of an
HTTP server) and ``exactcall mcp serve`` (HTTP clients in front of a stdio or HTTP server).

Real processes all the way: the MCP SDK's clients (stdio and Streamable HTTP), the proxy, the
effects server (tests/mcp_proxy_servers.py) over HTTP or stdio, a real Temporal dev server,
real SIGKILLs. Effects are counted at the destination (one line per real execution)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from exactcall.cli._main import main as cli_main
from exactcall.embedded._server import DevServer, free_port
from tests.mcp_proxy_client import (
    DEDUP,
    OUTCOME,
    READ_TIMEOUT,
    ROOT,
    Proxied,
    eventually,
    fresh,
    http_effects,
    meta,
    proxied,
    proxy_args,
    proxy_env,
    text,
    wait_port,
)


def lines(effects: Path, tool: str) -> list[str]:
    rows = effects.read_text().splitlines() if effects.exists() else []
    return [r for r in rows if r.split(" ")[0] == tool]


# -- exactcall mcp proxy --url ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_url_proxy_runs_writes_once_passes_reads_and_sends_the_headers(
    server: DevServer, tmp_path: Path, mode: str
) -> None:
    effects = tmp_path / "http.effects"
    env = {"EXACTCALL_TEST_TOKEN": "s3cret"}
    with http_effects(effects) as (url, _):
        flags = ("--header", "X-Exactcall-Test=tok-${EXACTCALL_TEST_TOKEN}")
        async with proxied(
            tmp_path,
            *flags,
            name=fresh(),
            address=server.address,
            url=url,
            env=env,
            effects=effects,
        ) as p:
            tools = await p.client.list_tools()
            assert "append" in {t.name for t in tools.tools}
            for line in ("a", "b", "a"):  # deliberate repeats run
                result = await p.client.call_tool("append", {"line": line})
                assert not result.is_error and DEDUP not in meta(result)
            copies = await asyncio.gather(
                *(p.client.call_tool("append", {"line": "c"}) for _ in range(3))
            )
            read = await p.client.call_tool("get_lines", {})
            read_again = await p.client.call_tool("get_lines", {})
    # A, B, A ran three times; three concurrent identical copies ran once, and all got it
    assert p.count("append", "a") == 2 and p.count("append", "b") == 1
    assert p.count("append", "c") == 1
    first = next(text(c) for c in copies if DEDUP not in meta(c))
    assert all(text(c).endswith(first) for c in copies)  # the others say they did not run
    assert sum(DEDUP in meta(c) for c in copies) == 2
    # each write carried the derived key and the header (its ${VAR} read from the environment)
    rows = lines(effects, "append")
    assert all(r.endswith(" header=tok-s3cret") for r in rows)
    assert len({r.split(" ")[2] for r in rows}) == 4
    # reads passed through, every time, without a key
    assert not read.is_error and not read_again.is_error and len(lines(effects, "get_lines")) == 2
    assert [r["outcome"] for r in p.audit_rows()].count("passthrough") == 2
    assert "s3cret" not in (tmp_path / f"{p.name}.log").read_text()  # the secret is not logged


async def test_url_server_not_reachable_is_not_sent_and_a_later_call_runs(
    server: DevServer, tmp_path: Path
) -> None:
    effects, port = tmp_path / "later.effects", free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with http_effects(effects, port) as (_, proc):
        async with proxied(
            tmp_path, name=fresh(), address=server.address, url=url, effects=effects
        ) as p:
            await p.client.list_tools()
            proc.kill()  # the server goes away between two calls
            proc.wait()
            refused = await p.client.call_tool("append", {"line": "x"})
            with http_effects(effects, port):  # back (a new process: it forgot the session)
                again = await p.client.call_tool("append", {"line": "x"})
                read = await p.client.call_tool("get_lines", {})
    assert refused.is_error and meta(refused)[OUTCOME] == "failed"
    assert "cannot reach" in text(refused) and "nothing was sent" in text(refused)
    assert "did not happen" in text(refused)
    assert not again.is_error and DEDUP not in meta(again) and not read.is_error
    assert p.count("append", "x") == 1  # the failed one never ran; the later one ran once


@pytest.mark.crash
async def test_url_server_killed_during_a_write_is_unknown_and_never_resent(
    server: DevServer, tmp_path: Path
) -> None:
    effects, port = tmp_path / "dies.effects", free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    args = {"line": "d", "seconds": 3}
    with http_effects(effects, port) as (_, proc):
        async with proxied(
            tmp_path, name=fresh(), address=server.address, url=url, effects=effects
        ) as p:
            pending = asyncio.create_task(p.client.call_tool("slow_append", args))
            await eventually(Path(f"{effects}.started").exists)
            proc.kill()  # SIGKILL mid-write: the stream breaks before any answer
            result = await asyncio.wait_for(pending, 30)
            with http_effects(effects, port):
                copy = await p.client.call_tool("slow_append", args)
                await asyncio.sleep(args["seconds"] + 0.5)
    assert result.is_error and meta(result)[OUTCOME] == "unknown"
    assert "whether it ran is unknown" in text(result) or "unknown" in text(result)
    # the identical call gets the unknown outcome: it is not sent to the server again
    assert copy.is_error and meta(copy)[OUTCOME] == "unknown"
    assert "outcome unknown" in text(copy) and "not sent again" in text(copy)
    assert p.count("slow_append") == 0


# -- exactcall mcp serve --------------------------------------------------------------------
@contextlib.contextmanager
def serving(
    tmp_path: Path, address: str, effects: Path, url: str | None = None, *flags: str
) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """``exactcall mcp serve`` (a real process) in front of the effects server: yields (its
    URL, the process, its name)."""
    name, port = fresh(), free_port()
    args = proxy_args(
        name,
        tmp_path / f"{name}.audit.jsonl",
        ("--port", str(port), *flags),
        address,
        "effects",
        effects,
        url=url,
        command="serve",
    )
    log = (tmp_path / f"{name}.log").open("a")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=proxy_env(tmp_path),
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}/mcp", proc, name
    except BaseException:
        print((tmp_path / f"{name}.log").read_text()[-4000:])
        raise
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@contextlib.asynccontextmanager
async def http_client(url: str, mode: str = "auto") -> AsyncIterator[Client]:
    transport = streamable_http_client(url)
    async with Client(transport, mode=mode, read_timeout_seconds=READ_TIMEOUT) as c:  # type: ignore[arg-type]
        yield c


def count(effects: Path, tool: str, arg: str | None = None) -> int:
    return Proxied(None, effects, Path(), "").count(tool, arg)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("upstream", "mode"), [("command", "legacy"), ("url", "legacy"), ("command", "2026-07-28")]
)
async def test_serve_gives_http_clients_the_proxy_guarantees(
    server: DevServer, tmp_path: Path, upstream: str, mode: str
) -> None:
    effects = tmp_path / "served.effects"
    with contextlib.ExitStack() as stack:
        url = None
        if upstream == "url":
            url, _ = stack.enter_context(http_effects(effects))
        endpoint, proc, name = stack.enter_context(serving(tmp_path, server.address, effects, url))
        async with http_client(endpoint, mode) as one, http_client(endpoint, mode) as two:
            assert one.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
            for line in ("a", "b", "a"):
                result = await one.call_tool("append", {"line": line})
                assert not result.is_error and DEDUP not in meta(result)
            # the same write from two client sessions at once: one execution, one result
            both = await asyncio.gather(
                one.call_tool("slow_append", {"line": "s", "seconds": 1.0}),
                two.call_tool("slow_append", {"line": "s", "seconds": 1.0}),
            )
            read = await two.call_tool("get_lines", {})
        proc.terminate()  # SIGTERM: the sessions end, the proxy exits 0
        assert proc.wait(30) == 0
    assert count(effects, "append", "a") == 2 and count(effects, "append", "b") == 1
    assert count(effects, "slow_append") == 1
    ran = next(text(r) for r in both if DEDUP not in meta(r))
    assert all(text(r).endswith(ran) for r in both)
    assert [DEDUP in meta(r) for r in both].count(True) == 1
    assert not read.is_error and count(effects, "get_lines") == 1
    rows = [json.loads(r) for r in (tmp_path / f"{name}.audit.jsonl").read_text().splitlines()]
    assert sorted(r["outcome"] for r in rows if r["tool"] == "slow_append") == [
        "deduplicated",
        "executed",
    ]
    if upstream == "command":  # the (last) server process the sessions had is gone
        pids = Path(f"{effects}.pid").read_text().split()
        assert not Path(f"/proc/{pids[0]}").exists()


async def _open_raw_session(http: httpx2.AsyncClient, endpoint: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    headers = {"accept": "application/json, text/event-stream"}
    async with http.stream("POST", endpoint, json=init, headers=headers) as response:
        assert response.status_code == 200
        sid = response.headers["mcp-session-id"]
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                assert json.loads(line[5:])["id"] == 1
                break
    headers["mcp-session-id"] = sid
    headers["mcp-protocol-version"] = "2025-11-25"
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(endpoint, json=note, headers=headers)).status_code == 202
    return headers


async def test_serve_keeps_an_answer_that_reached_no_client_for_the_retry(
    server: DevServer, tmp_path: Path
) -> None:
    effects = tmp_path / "gone.effects"
    args = {"line": "r", "seconds": 1.5}
    with serving(tmp_path, server.address, effects) as (endpoint, _, name):
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open_raw_session(http, endpoint)
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
            call["params"] = {"name": "slow_append", "arguments": args}  # type: ignore[assignment]
            async with http.stream("POST", endpoint, json=call, headers=headers) as response:
                assert response.status_code == 200
                await eventually(Path(f"{effects}.started").exists)
            # the client hung up before the answer: the write goes on, its answer reaches no one
            await eventually(lambda: count(effects, "slow_append") == 1)
        async with http_client(endpoint) as retry:  # a new session retries the same call
            result = await retry.call_tool("slow_append", args)
            fresh_call = await retry.call_tool("slow_append", args)
    assert not result.is_error and meta(result)[DEDUP] is True
    assert "nothing was sent to the server again" in text(result)
    # once that answer was delivered, the same call again is a new call, and runs
    assert not fresh_call.is_error and DEDUP not in meta(fresh_call)
    assert count(effects, "slow_append") == 2
    outcomes = [
        json.loads(r)["outcome"]
        for r in (tmp_path / f"{name}.audit.jsonl").read_text().splitlines()
    ]
    assert outcomes.count("executed") == 2 and outcomes.count("deduplicated") == 1


async def test_serve_2026_client_closing_its_stream_cancels_and_the_retry_does_not_rerun(
    server: DevServer, tmp_path: Path
) -> None:
    """On the 2026-07-28 wire a client cancels by closing the request's stream: the write it
    cut off after it was sent is recorded (or unknown) and never sent again by a retry."""
    effects = tmp_path / "cut.effects"
    args = {"line": "k", "seconds": 1.0}
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "slow_append", "arguments": args, "_meta": envelope},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "slow_append",
    }
    with serving(tmp_path, server.address, effects) as (endpoint, _, name):
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            http.stream("POST", endpoint, json=call, headers=headers) as response,
        ):
            assert response.status_code == 200 and "mcp-session-id" not in response.headers
            await eventually(Path(f"{effects}.started").exists)
        await asyncio.sleep(args["seconds"] + 4)  # the server's grace after the cancel
        ran = count(effects, "slow_append")
        async with http_client(endpoint, "2026-07-28") as retry:
            again = await retry.call_tool("slow_append", args)
        await asyncio.sleep(args["seconds"] + 0.5)
    assert ran <= 1 and count(effects, "slow_append") == ran  # the retry sent nothing
    # cut off after it was sent, the server did not answer the cancel: unknown, not re-sent
    assert again.is_error and meta(again)[OUTCOME] == "unknown"
    assert "not sent again" in text(again) and "cancelled after it was sent" in text(again)
    rows = [json.loads(r) for r in (tmp_path / f"{name}.audit.jsonl").read_text().splitlines()]
    assert rows[0]["outcome"] == "cancelled"


async def test_serve_ends_a_session_whose_client_went_away_without_saying(
    server: DevServer, tmp_path: Path
) -> None:
    effects = tmp_path / "idle.effects"
    with serving(tmp_path, server.address, effects, None, "--session-idle", "1s") as (
        endpoint,
        _,
        _,
    ):
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open_raw_session(http, endpoint)  # then silence, no DELETE
            upstream = int(Path(f"{effects}.pid").read_text().split()[0])
            assert Path(f"/proc/{upstream}").exists()
            await eventually(lambda: not Path(f"/proc/{upstream}").exists(), timeout=20)
            ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
            gone = await http.post(endpoint, json=ping, headers=headers)
        async with http_client(endpoint) as again:  # a client that comes back starts over
            result = await again.call_tool("append", {"line": "i"})
    assert gone.status_code == 404 and "initialize again" in gone.text
    assert not result.is_error and count(effects, "append", "i") == 1


async def test_serve_refuses_foreign_origins_and_unknown_sessions(
    server: DevServer, tmp_path: Path
) -> None:
    effects = tmp_path / "refuse.effects"
    with serving(tmp_path, server.address, effects) as (endpoint, _, _):
        async with httpx2.AsyncClient(timeout=30) as http:
            accept = {"accept": "application/json, text/event-stream"}
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            evil = await http.post(
                endpoint, json=ping, headers={**accept, "origin": "https://evil.example"}
            )
            no_session = await http.post(endpoint, json=ping, headers=accept)
            unknown = await http.post(
                endpoint, json=ping, headers={**accept, "mcp-session-id": "nope"}
            )
            not_json = await http.post(endpoint, content=b"{oops", headers=accept)
            wrong_path = await http.post(endpoint + "/else", json=ping, headers=accept)
            put = await http.put(endpoint, json=ping)
            headers = await _open_raw_session(http, endpoint)  # a local origin is fine
            local = await http.post(
                endpoint, json=ping, headers={**headers, "origin": "http://localhost:3000"}
            )
            ended = await http.delete(endpoint, headers=headers)
            after = await http.post(endpoint, json=ping, headers=headers)
    assert evil.status_code == 403 and "allow-origin" in evil.text
    assert no_session.status_code == 400 and "initialize" in no_session.json()["error"]["message"]
    assert unknown.status_code == 404 and not_json.status_code == 400
    assert wrong_path.status_code == 404 and "/mcp" in wrong_path.text
    assert put.status_code == 405
    assert local.status_code == 200 and '"result"' in local.text
    assert ended.status_code == 200 and after.status_code == 404
    assert count(effects, "append") == 0


def test_http_flags_are_checked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    os.environ.pop("EXACTCALL_TEST_UNSET", None)
    cases = [
        (["mcp", "proxy", "--url", "ftp://x/mcp"], "http:// or https://"),
        (["mcp", "proxy", "--header", "A=b", "--", "srv"], "--header goes with --url"),
        (["mcp", "proxy", "--url", "http://x/mcp", "--", "srv"], "one of them"),
        (["mcp", "proxy"], "one of them"),
        (["mcp", "serve", "--port", "1", "--url", "http://x/mcp", "--", "s"], "one of them"),
    ]
    for argv, said in cases:
        assert cli_main(argv) == 2, argv
        assert said in capsys.readouterr().err
    for header, said in (("A=${EXACTCALL_TEST_UNSET}", "is not set"), ("=x", "NAME=VALUE")):
        assert cli_main(["mcp", "proxy", "--url", "http://x/mcp", "--header", header]) == 2
        assert said in capsys.readouterr().err


def test_serve_says_when_it_cannot_listen(server: DevServer, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "exactcall",
                "mcp",
                "serve",
                "--port",
                str(port),
                "--address",
                server.address,
                "--",
                sys.executable,
                "-m",
                "tests.mcp_proxy_servers",
                "effects",
                str(tmp_path / "e"),
            ],
            cwd=ROOT,
            env=proxy_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
