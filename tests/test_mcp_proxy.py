"""``exactcall mcp proxy``: the MCP SDK's real stdio client -> the proxy (a real process) -> a
real stdio MCP server (tests/mcp_proxy_servers.py), on a real Temporal dev server. Effects are
counted where they happen: the server appends one line per real execution to a file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from temporalio.client import Client as TemporalClient

import exactcall
from exactcall._canonical import derive_key
from exactcall._worker import Connection
from exactcall.approvals import approve, list_pending
from exactcall.cli._main import main as cli_main
from exactcall.embedded._server import DevServer
from exactcall.embedded._shared import is_configured
from exactcall.mcp._proxy_policy import first_word
from exactcall.mcp._proxy_workflow import MCP_PROXY_TOOL, proxy_tool
from exactcall.mcp.proxy import derive_name
from tests.mcp_proxy_client import (
    DEDUP,
    OUTCOME,
    alive,
    eventually,
    fresh,
    meta,
    parked,
    proxied,
    proxy_args,
    read_lines,
    spawn_raw,
    text,
)
from tests.mcp_proxy_servers import _answer


# -- identity, window, dedupe ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_identical_write_after_its_answer_runs_again(
    server: DevServer, tmp_path: Path, mode: str
) -> None:
    name = fresh()
    async with proxied(tmp_path, name=name, address=server.address, mode=mode) as p:
        assert p.client.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
        first = await p.client.call_tool("append", {"line": "a"}, meta={"io.example/trace": "t1"})
        second = await p.client.call_tool("append", {"line": "a"})
    # the first answer reached the client: the second identical call is deliberate, and runs
    assert p.count("append") == 2 and text(first).endswith("trace=t1")  # the client's _meta too
    assert not first.is_error and DEDUP not in meta(first) and DEDUP not in meta(second)
    rows = p.audit_rows()
    assert [r["outcome"] for r in rows] == ["executed", "executed"]
    h = exactcall.intent_hash(
        proxy_tool, server=name, tool="append", arguments={"line": "a"}, extra={}
    )
    assert {r["args_hash"] for r in rows} == {h}
    # the server got exactcall's derived key in _meta, from the documented formula; a new
    # call is a new step of the same workflow id, so a new key
    wid, step = rows[0]["workflow_id"], rows[0]["step"]
    assert wid == f"exactcall-mcp-{name}-{h[:32]}" and step.startswith("append@")
    assert rows[1]["workflow_id"] == wid and rows[1]["step"] != step
    keys = p.keys("append")
    assert keys[0] == derive_key("default", wid, step, MCP_PROXY_TOOL, "1") and len(set(keys)) == 2


async def test_concurrent_identical_writes_from_two_proxies_run_once(
    server: DevServer, tmp_path: Path
) -> None:
    name, effects = fresh(), tmp_path / "shared.effects"
    async with (
        proxied(tmp_path, name=name, address=server.address, effects=effects) as a,
        proxied(tmp_path, name=name, address=server.address, effects=effects) as b,
    ):
        # a write that takes 1 s, so every copy reaches its proxy before the first answer is
        # delivered (a copy that arrives after it is a deliberate repeat and runs: with a write
        # of 28 ms, a copy read 50 ms late did, in a CI run)
        args = {"line": "c", "seconds": 1.0}
        calls = [c.client.call_tool("slow_append", args) for c in (a, b, a, b, a, b)]
        results = await asyncio.gather(*calls)
    assert a.count("slow_append") == 1
    ran = [r for r in results if not meta(r).get(DEDUP)]
    assert len(ran) == 1 and not any(r.is_error for r in results)
    for r in results:  # the copies get its answer, and a note that it ran once
        assert text(r).endswith(text(ran[0]))
        assert r is ran[0] or "nothing was sent to the server again" in text(r)


async def test_different_arguments_run_separately(server: DevServer, tmp_path: Path) -> None:
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        await p.client.call_tool("append", {"line": "a"})
        await p.client.call_tool("append", {"line": "b"})
        await p.client.call_tool("append", {"line": "a"})
    assert (p.count("append", "a"), p.count("append", "b")) == (2, 1)  # A, B, A: 3 writes


async def test_the_window_slides_from_the_recorded_outcome(
    server: DevServer, tmp_path: Path
) -> None:
    flags = ("--dedupe-window", "append=1.5s")
    async with proxied(tmp_path, *flags, name=fresh(), address=server.address) as p:
        first = await p.client.call_tool("append", {"line": "w"})
        again = await p.client.call_tool("append", {"line": "w"})
        assert meta(again)[DEDUP] is True and p.count("append") == 1
        # the model reads that nothing ran again, and how to run it on purpose
        note = again.content[0].text  # type: ignore[union-attr]
        assert "already ran with these exact arguments" in note and "--dedupe-window" in note
        assert "nothing was sent to the server again" in note and "1.5s" in note
        assert text(again).endswith(text(first))
        await asyncio.sleep(2.2)
        later = await p.client.call_tool("append", {"line": "w"})
    assert DEDUP not in meta(later) and p.count("append") == 2
    assert len(set(p.keys("append"))) == 2  # a new run, a new step, a new key


async def test_reads_pass_through_every_time(server: DevServer, tmp_path: Path) -> None:
    # default: get_lines is a read by its name; tally's readOnlyHint is not trusted
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        for _ in range(3):
            await p.client.call_tool("get_lines", {})
        for _ in range(2):
            await p.client.call_tool("tally", {})
    assert (p.count("get_lines"), p.count("tally")) == (3, 2)
    assert [r["outcome"] for r in p.audit_rows()].count("executed") == 2  # tally: guarded
    assert [r["outcome"] for r in p.audit_rows()].count("passthrough") == 3
    # --trusted: the hint decides; --read-only and --write override names (and the deprecated
    # --dedupe / --no-dedupe still mean --write / --read-only)
    flags = ("--trusted", "--read-only", "append", "--write", "get_lines")
    flags += ("--no-dedupe", "fail_soft", "--dedupe", "get_count")
    async with proxied(tmp_path, *flags, name=fresh(), address=server.address) as q:
        for _ in range(2):
            for tool in ("tally", "append", "get_lines", "fail_soft", "get_count"):
                await q.client.call_tool(
                    tool, {"line": "r"} if tool in ("append", "fail_soft") else {}
                )
    counts = [q.count(t) for t in ("tally", "append", "get_lines", "fail_soft", "get_count")]
    assert counts == [2, 2, 2, 2, 2]  # a guarded write answered is a new call when repeated
    how = {(r["tool"], r["outcome"]) for r in q.audit_rows()}
    assert how == {
        ("tally", "passthrough"),
        ("append", "passthrough"),
        ("get_lines", "executed"),
        ("fail_soft", "passthrough"),
        ("get_count", "executed"),
    }


async def test_client_keys_are_the_identity(server: DevServer, tmp_path: Path) -> None:
    k1, k2 = {"io.exactcall/idempotency-key": "k-1"}, {"io.exactcall/idempotency-key": "k-2"}
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        one = await p.client.call_tool("append", {"line": "k"}, meta=k1)
        two = await p.client.call_tool("append", {"line": "k"}, meta=k2)
        assert p.count("append") == 2  # different keys, same arguments: both run
        again = await p.client.call_tool("append", {"line": "k"}, meta=k1)
        other = await p.client.call_tool("append", {"line": "other"}, meta=k1)
        bad = await p.client.call_tool(
            "append", {"line": "k"}, meta={"io.exactcall/idempotency-key": ""}
        )
        k3 = {"io.exactcall/idempotency-key": "k-3"}
        for _ in range(2):  # "it did not happen" frees the key: a retry with it runs
            refused = await p.client.call_tool("refuse", {"line": "k"}, meta=k3)
            assert refused.is_error and "quota exceeded" in text(refused)
    assert p.count("refuse") == 2
    assert not one.is_error and not two.is_error
    assert meta(again)[DEDUP] is True and text(again).endswith(text(one))
    assert "already ran" in text(again) and "Send a new key" in text(again)
    assert other.is_error and "refused" in text(other) and "Nothing was executed" in text(other)
    assert bad.is_error and "non-empty string" in text(bad)
    assert p.count("append") == 2


async def test_tool_errors_not_executed_run_again_others_are_recorded(
    server: DevServer, tmp_path: Path
) -> None:
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        r1 = await p.client.call_tool("refuse", {"line": "q"})
        r2 = await p.client.call_tool("refuse", {"line": "q"})
        s1 = await p.client.call_tool("fail_soft", {"line": "q"})
        s2 = await p.client.call_tool("fail_soft", {"line": "q"})
    # "it did not happen" releases the identity: the same call is sent again
    assert p.count("refuse") == 2 and r1.is_error and r2.is_error
    assert "quota exceeded" in text(r2) and meta(r2)[OUTCOME] == "failed"
    # any other error result reached the client as it was: a repeat is the model's own call
    assert p.count("fail_soft") == 2 and s2.is_error and DEDUP not in meta(s2)
    assert text(s2) == text(s1) == "timeout talking to the ledger"
    assert [r["outcome"] for r in p.audit_rows()] == ["failed"] * 4


# -- crashes ----------------------------------------------------------------------------------
@pytest.mark.crash
async def test_proxy_sigkilled_during_a_slow_write_is_not_resent(
    server: DevServer, client: TemporalClient, tmp_path: Path
) -> None:
    name, effects = fresh(), tmp_path / "slow.effects"
    args = {"line": "s", "seconds": 1.5}
    with contextlib.suppress(Exception):  # the client's session dies with the proxy
        async with proxied(tmp_path, name=name, address=server.address, effects=effects) as p:
            pending = asyncio.create_task(p.client.call_tool("slow_append", args))
            await eventually(Path(f"{effects}.started").exists)
            os.killpg(p.pids()[1], signal.SIGKILL)  # the proxy and its server, mid-write
            await asyncio.wait({pending}, timeout=10)
            assert pending.done() and pending.exception() is not None  # connection closed
    await asyncio.sleep(2.0)  # longer than the write: it really did not land
    assert p.count("slow_append") == 0
    async with proxied(tmp_path, name=name, address=server.address, effects=effects) as p2:
        again = await p2.client.call_tool("slow_append", args)  # the client tries once more
        assert again.is_error and meta(again)[OUTCOME] == "unknown"
        assert "outcome unknown" in text(again) and "not sent again" in text(again)
        found = re.search(r"exactcall resolve (\S+) (\S+) --landed", text(again))
        assert found is not None
        wid, step = found.groups()
        rows = await parked(client, wid)
        assert [(r.step, r.tool, r.args["tool"]) for r in rows] == [
            (step, MCP_PROXY_TOOL, "slow_append")
        ]
        assert p2.count("slow_append") == 0  # not re-sent by the restarted proxy
        resolve = ["resolve", wid, step, "--not-landed", "--address", server.address, "--yes"]
        assert await asyncio.to_thread(cli_main, resolve) == 0
        settled = await p2.client.call_tool("slow_append", args)
    assert not settled.is_error and meta(settled)[DEDUP] is True
    assert p2.count("slow_append") == 1  # run once more, by the person's verdict, same key
    assert p2.keys("slow_append") == [derive_key("default", wid, step, MCP_PROXY_TOOL, "1")]
    assert [r["outcome"] for r in p2.audit_rows()][-2:] == ["unknown", "deduplicated"]


@pytest.mark.crash
async def test_server_dying_during_a_write_is_unknown(
    server: DevServer, client: TemporalClient, tmp_path: Path
) -> None:
    effects = tmp_path / "dies.effects"
    async with proxied(tmp_path, name=fresh(), address=server.address, effects=effects) as p:
        pending = asyncio.create_task(
            p.client.call_tool("slow_append", {"line": "d", "seconds": 5})
        )
        await eventually(Path(f"{effects}.started").exists)
        os.kill(p.pids()[0], signal.SIGKILL)
        result = await asyncio.wait_for(pending, 30)
    assert result.is_error and meta(result)[OUTCOME] == "unknown"
    wid, step = meta(result)["io.exactcall/workflow-id"], meta(result)["io.exactcall/step"]
    assert len(await parked(client, wid)) == 1
    assert p.count("slow_append") == 0
    # a person checked the destination: it did land; the copy gets that result, nothing re-sent
    landed = [
        "resolve",
        wid,
        step,
        "--landed",
        "--result",
        '"it went through"',
        "--yes",
        "--address",
        server.address,
    ]
    async with proxied(tmp_path, name=p.name, address=server.address, effects=effects) as p2:
        assert await asyncio.to_thread(cli_main, landed) == 0
        copy = await p2.client.call_tool("slow_append", {"line": "d", "seconds": 5})
    assert not copy.is_error and text(copy).endswith("it went through")
    assert meta(copy)[DEDUP] is True and "nothing was sent to the server again" in text(copy)
    assert p2.count("slow_append") == 0


# -- approvals ------------------------------------------------------------------------------
async def test_approval_by_hash_releases_exactly_that_call(
    server: DevServer,
    client: TemporalClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = fresh()
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    flags = ("--approve", "append", "--approval-wait", "1s")
    async with proxied(tmp_path, *flags, name=name, address=server.address) as p:
        waiting = await p.client.call_tool("append", {"line": "x"}, progress_callback=on_progress)
        other = await p.client.call_tool("append", {"line": "y"})
        assert waiting.is_error and meta(waiting)[OUTCOME] == "awaiting_approval"
        assert progress and "exactcall approve" in progress[0]
        found = re.search(
            r"exactcall approve (\S+) (\S+) --hash (\w+) --address (\S+)", text(waiting)
        )
        assert found is not None and found.group(4) == server.address
        wid, step, h = found.group(1), found.group(2), found.group(3)
        assert h == exactcall.intent_hash(
            proxy_tool, server=name, tool="append", arguments={"line": "x"}, extra={}
        )
        rejoin = await p.client.call_tool("append", {"line": "x"})  # joins the pending call
        assert meta(rejoin)[OUTCOME] == "awaiting_approval"
        assert meta(rejoin)["io.exactcall/step"] == step
        listed = {r.workflow_id: r for r in await list_pending(client)}
        assert [r.step for r in await list_pending(client) if r.workflow_id == wid] == [step]
        assert listed[wid].args_hash == h and listed[wid].args["arguments"] == {"line": "x"}
        y = listed[meta(other)["io.exactcall/workflow-id"]]
        wrong = await approve(client, wid, step, args_hash=y.args_hash, by="tester")
        assert not wrong.accepted and p.count("append") == 0
        cmd = [
            "approve",
            wid,
            step,
            "--hash",
            h,
            "--address",
            server.address,
            "--yes",
            "--as",
            "tester",
        ]
        assert await asyncio.to_thread(cli_main, cmd) == 0
        done = await p.client.call_tool("append", {"line": "x"})  # the same call joins
        assert not done.is_error and p.count("append", "x") == 1
        capsys.readouterr()
        listing = ["approvals", "list", "--json", "--address", server.address]
        assert await asyncio.to_thread(cli_main, listing) == 0
        pending = capsys.readouterr().out
        assert y.workflow_id in pending and wid not in pending  # only x was approved
        no = ["deny", y.workflow_id, y.step, "--hash", y.args_hash, "--reason", "not this one"]
        assert await asyncio.to_thread(cli_main, [*no, "--address", server.address, "--yes"]) == 0
        refused = await p.client.call_tool("append", {"line": "y"})
    assert refused.is_error and meta(refused)[OUTCOME] == "denied" and "denied" in text(refused)
    assert (p.count("append", "x"), p.count("append", "y")) == (1, 0)
    outcomes = [r["outcome"] for r in p.audit_rows()]
    assert outcomes == ["awaiting_approval"] * 3 + ["deduplicated", "denied"]


# -- the stdio stream -----------------------------------------------------------------------
async def test_batches_and_non_json_lines_pass_through_untouched(
    server: DevServer, tmp_path: Path
) -> None:
    upstream_log = tmp_path / "raw.log"
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}
    batch = [
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "poke", "arguments": {}},
        },
    ]
    sent = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b"not json at all {",
        json.dumps(batch, indent=None).encode(),
        b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"poke","arguments":{"n":1}}}',
    ]
    args = proxy_args(fresh(), tmp_path / "raw.audit", (), server.address, "raw", upstream_log)
    proc = spawn_raw(args, tmp_path)
    out: list[bytes] = []
    reader = threading.Thread(target=read_lines, args=(proc, out), daemon=True)
    reader.start()
    try:
        assert proc.stdin is not None
        for line in sent:
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
        await eventually(lambda: any(b'"id":4' in ln or b'"id": 4' in ln for ln in out))
    finally:
        if proc.stdin:
            proc.stdin.close()
        await asyncio.to_thread(proc.wait, 30)
        reader.join(5)
        if proc.stdout:
            proc.stdout.close()
    received = upstream_log.read_bytes().splitlines(keepends=True)
    assert received[:4] == [line + b"\n" for line in sent[:4]]  # byte for byte, in order
    injected = json.loads(received[4])  # the write was taken over: the proxy's own request
    assert injected["id"].startswith("exactcall-proxy-") and injected["params"]["name"] == "poke"
    assert len(injected["params"]["_meta"]["io.exactcall/idempotency-key"]) == 64
    assert b"this line is not JSON\n" in out  # the server's own stray line, as it was
    assert json.dumps([_answer(m) for m in batch]).encode() + b"\n" in out
    answer = next(
        json.loads(ln) for ln in out if ln.startswith(b"{") and json.loads(ln).get("id") == 4
    )
    assert answer["result"]["content"][0]["text"] == "poked {'n': 1}"
    for line in out:  # the proxy adds nothing but JSON-RPC
        assert line == b"this line is not JSON\n" or isinstance(json.loads(line), dict | list)


# -- the embedded server ----------------------------------------------------------------------
@pytest.mark.crash
async def test_embedded_server_keeps_dedupe_across_restarts_and_kills(tmp_path: Path) -> None:
    home, effects = tmp_path / "home", tmp_path / "emb.effects"
    info = home / "mcp" / "temporal.json"
    window = ("--dedupe-window", "append=1h")  # identical appends run once, across restarts
    where = {"effects": effects, "home": home}
    try:
        async with proxied(tmp_path, *window, name="emb", address=None, **where) as p:
            first = await p.client.call_tool("append", {"line": "e"})
        pid1 = json.loads(info.read_text())["pid"]
        assert not alive(pid1)  # stopped with the proxy; its SQLite file stays
        with contextlib.suppress(Exception):
            async with proxied(tmp_path, *window, name="emb", address=None, **where) as p2:
                again = await p2.client.call_tool("append", {"line": "e"})
                os.killpg(p2.pids()[1], signal.SIGKILL)
        pid2 = json.loads(info.read_text())["pid"]
        assert pid2 != pid1 and alive(pid2)  # left running by the killed proxy...
        flags = (*window, "--approve", "get_lines", "--approval-wait", "0.2s")
        async with proxied(
            tmp_path, *flags, name="emb", address=None, effects=effects, home=home
        ) as p3:
            third = await p3.client.call_tool("append", {"line": "e"})
            hint = await p3.client.call_tool("get_lines", {})
        assert json.loads(info.read_text())["pid"] == pid2  # ...adopted, then stopped
        await eventually(lambda: not alive(pid2), 15)
    finally:
        with contextlib.suppress(Exception):
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    assert not first.is_error and meta(again)[DEDUP] is True and meta(third)[DEDUP] is True
    assert p3.count("append") == 1
    # the commands a proxy on its embedded server prints name that server's address
    assert f"--address {json.loads(info.read_text())['address']}" in text(hint)


@pytest.mark.crash
async def test_proxies_share_one_embedded_server_and_take_over_when_it_dies(
    tmp_path: Path,
) -> None:
    """Proxies of different names share one embedded server per user: the first one's exit
    leaves it to the other, a killed server is replaced within seconds on the same database,
    and the last proxy to exit stops it; every write once."""
    home, effects = tmp_path / "home", tmp_path / "share.effects"
    info = home / "mcp" / "temporal.json"
    where = {"effects": effects, "home": home, "address": None}
    up, leave = asyncio.Event(), asyncio.Event()

    async def owner() -> None:  # its own task: the client's scopes close where they opened
        async with proxied(tmp_path, name="one", **where) as p:
            assert not (await p.client.call_tool("append", {"line": "a"})).is_error
            up.set()
            await leave.wait()

    first = asyncio.create_task(owner())
    try:
        await asyncio.wait_for(up.wait(), 60)
        pid1 = json.loads(info.read_text())["pid"]
        async with proxied(tmp_path, name="two", **where) as other:
            assert not (await other.client.call_tool("append", {"line": "b"})).is_error
            assert json.loads(info.read_text())["pid"] == pid1  # shared, not a second one
            leave.set()  # the proxy that started it exits...
            await first
            after_exit = await other.client.call_tool("append", {"line": "c"})
            assert alive(pid1)  # ...and leaves it to the other
            os.kill(pid1, signal.SIGKILL)  # now the server itself dies
            await eventually(lambda: not alive(pid1), 10)
            t0 = time.monotonic()
            after_kill = await other.client.call_tool("append", {"line": "d"})
            took = time.monotonic() - t0
            pid2 = json.loads(info.read_text())["pid"]
        await eventually(lambda: not alive(pid2), 20)  # the last one stops it
    finally:
        leave.set()
        with contextlib.suppress(Exception):
            await first
        with contextlib.suppress(Exception):
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    assert not after_exit.is_error, text(after_exit)
    assert not after_kill.is_error, text(after_kill)
    assert took < 20, took
    assert pid2 not in (pid1, None)
    assert [other.count("append", x) for x in "abcd"] == [1, 1, 1, 1]


# -- usage ----------------------------------------------------------------------------------
def test_contradicting_flags_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mcp", "proxy", "--read-only", "t", "--approve", "t", "--", sys.executable]
    assert cli_main(argv) == 2
    assert "both as a read" in capsys.readouterr().err
    assert cli_main(["mcp", "proxy", "--name", "bad name", "--", sys.executable]) == 2
    assert cli_main(["mcp", "proxy"]) == 2


def test_names_and_which_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    github = ["npx", "-y", "@modelcontextprotocol/server-github"]
    assert derive_name(github).startswith("server-github-")
    assert derive_name(github) == derive_name(list(github)) != derive_name([*github, "--ro"])
    assert derive_name([sys.executable, "-m", "notes_server"]).startswith("notes_server-")
    assert first_word("getUser") == first_word("get-user") == "get"
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", "/nonexistent/temporal.toml")
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    assert not is_configured(Connection())  # -> the embedded server
    assert is_configured(Connection(address="temporal.internal:7233"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.internal:7233")
    assert is_configured(Connection())
