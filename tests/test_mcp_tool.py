"""MCP tools as exactcall tools: a real stdio MCP server, a real Temporal dev server, real
worker processes killed with SIGKILL. Effects are counted at the server (lines of its file)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

import exactcall
import exactcall.mcp
from exactcall import approvals, reconciliation
from exactcall._worker import Connection, build_worker, connect
from exactcall.cli._main import main as cli_main
from exactcall.embedded._server import DevServer
from exactcall.testing import WorkerProcess
from tests import mcp_app
from tests.conftest import ROOT, plan, start_agent, step
from tests.mcp_servers import effects
from tests.workflows import Agent

T = TypeVar("T")


# -- fixtures and helpers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def effect_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "effects.jsonl"


@pytest.fixture(scope="module")
async def mcp_worker(server: DevServer, effect_file: Path) -> AsyncIterator[tuple[Client, str]]:
    """One in-process worker with the MCP servers ``t`` and ``tt``, for the whole module."""
    plugin = exactcall.Plugin(mcp_servers=mcp_app.servers(effect_file))
    client = await connect(Connection(address=server.address), plugin)
    tq = f"mcp-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, tq, [Agent, mcp_app.Notebook]):
        yield client, tq


def uid() -> str:
    return uuid.uuid4().hex[:10]


def made(path: Path, text: str, kind: str = "") -> list[dict[str, Any]]:
    """The effects (or ``kind`` side records) of the call(s) with this text."""
    return [r for r in effects(path, kind) if r.get("text") == text]


async def run(client: Client, tq: str, *steps: dict[str, Any], wid: str | None = None) -> Any:
    handle = await start_agent(client, tq, plan(*steps), wid=wid)
    return handle.id, await handle.result()


async def eventually(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float = 15
) -> T:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await fn()
        if ok(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: last value {value!r}")
        await asyncio.sleep(0.2)


# -- the happy path ----------------------------------------------------------------------------
async def test_a_write_runs_once_with_its_key_in_meta(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    text, wid = uid(), f"mcp-once-{uid()}"
    steps = [
        step("mcp.t.append", text=text, key="s1"),
        step("mcp.t.append", text=text, key="s1"),
        step("mcp.t.append", text=text + "-other", key="s1"),
    ]
    _, out = await run(client, tq, *steps, wid=wid)
    [effect] = made(effect_file, text)
    assert out[0] == {"ok": {"line": out[0]["ok"]["line"], "text": text}}
    assert out[1] == out[0]
    assert out[2]["error"] == "IntentConflict" and "Nothing was executed" in out[2]["message"]
    assert made(effect_file, text + "-other") == []
    assert effect["key"] == exactcall.derive_key("default", wid, "s1", "mcp.t.append", "1")
    # a new run of the same workflow id (a retried run, a reset) gets the recorded result
    _, again = await run(client, tq, steps[0], wid=wid)
    assert again == [out[0]]
    assert len(made(effect_file, text)) == 1


async def test_a_workflow_calls_the_tool_object(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    text, wid = uid(), f"notebook-{uid()}"
    out = await client.execute_workflow(mcp_app.Notebook.run, text, id=wid, task_queue=tq)
    [effect] = made(effect_file, text)
    assert out == {"line": out["line"], "text": text}
    assert effect["key"] == exactcall.derive_key(
        "default", wid, "mcp.t.append#1", "mcp.t.append", "1"
    )
    with pytest.raises(ValueError, match=r"two exactcall tools are named 'mcp\.t\.append'"):
        exactcall.mcp.tool("t", "read_lines", tool_name="mcp.t.append")
    assert exactcall.mcp.tool("t", "append") is mcp_app.append  # defined once


async def test_a_streamable_http_server(server: DevServer, tmp_path: Path) -> None:
    file, port = tmp_path / "effects.jsonl", free_port()
    cmd = [*mcp_app.command(file), "--http", str(port)]
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await wait_for_port(port)
        plugin = exactcall.Plugin(mcp_servers={"t": f"http://127.0.0.1:{port}/mcp"})
        client = await connect(Connection(address=server.address), plugin)
        tq, text, wid = f"mcp-http-{uid()}", uid(), f"notebook-{uid()}"
        async with build_worker(client, tq, [mcp_app.Notebook]):
            out = await client.execute_workflow(mcp_app.Notebook.run, text, id=wid, task_queue=tq)
    finally:
        proc.kill()
        await proc.wait()
    [effect] = made(file, text)
    assert out == {"line": 1, "text": text}
    assert effect["key"] == exactcall.derive_key(
        "default", wid, "mcp.t.append#1", "mcp.t.append", "1"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_for_port(port: int, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            writer.close()
            await writer.wait_closed()
            return


async def test_read_only_tool_runs_every_time(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    before = len(effects(effect_file, "reads"))
    _, out = await run(client, tq, step("mcp.t.read_lines"), step("mcp.t.read_lines"))
    assert [o["ok"]["lines"] >= 0 for o in out] == [True, True]
    assert len(effects(effect_file, "reads")) == before + 2


async def test_read_only_hint_decides_only_on_a_trusted_server(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker  # the worker read the trusted server's hints when it started
    assert mcp_app.trusted_show_key.attempt_reads is True
    assert mcp_app.trusted_append.attempt_reads is False  # readOnlyHint false
    assert mcp_app.trusted_sneaky.attempt_reads is True  # trusted means believed
    assert mcp_app.untrusted_show_key.attempt_reads is False
    assert mcp_app.untrusted_sneaky.attempt_reads is False
    # the hint decides how this worker's attempts run, never the workflow's path: that is
    # the declaration's (read_only=None: a write's) on every worker and in every replay
    tools = (mcp_app.trusted_show_key, mcp_app.trusted_sneaky, mcp_app.untrusted_sneaky)
    assert [t.options.read_only for t in tools] == [False, False, False]
    # a hinted read's attempt claims nothing: no run claim for its workflow id
    wid, out = await run(client, tq, step("mcp.tt.show_key"))
    assert "ok" in out[0]
    with pytest.raises(RPCError):
        await client.get_workflow_handle(f"exactcall-run-{wid}").describe()
    # the untrusted server's lying hint is ignored: its "read-only" write is deduped
    text = uid()
    sneaky = step("mcp.t.sneaky_append", text=text, key="s")
    _, out = await run(client, tq, sneaky, sneaky)
    assert out[0] == out[1] and "ok" in out[0]
    assert len(made(effect_file, text)) == 1


# -- outcomes ----------------------------------------------------------------------------------
async def test_not_executed_flag_is_retried_then_a_definite_failure(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    lucky, doomed = uid(), uid()
    _, out = await run(
        client,
        tq,
        step("mcp.t.not_executed", text=lucky, fail_first=2),
        step("mcp.t.not_executed", text=doomed),
    )
    assert out[0]["ok"]["text"] == lucky
    assert len(made(effect_file, lucky)) == 1
    assert len(made(effect_file, lucky, "attempts")) == 3  # two refusals, then it ran
    assert out[1]["error"] == "ToolFailed" and "did not happen" in out[1]["message"]
    assert "attempt 3 refused" in out[1]["message"]
    assert made(effect_file, doomed) == []
    assert len(made(effect_file, doomed, "attempts")) == 3  # the retry policy's 3 attempts


async def test_an_error_without_the_flag_is_unknown_and_reconciled(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    text = uid()
    the_step = step("mcp.t.fails_after_effect", text=text, on_unknown="raise")
    wid, out = await run(client, tq, the_step)
    assert out[0]["error"] == "AmbiguousOutcome"
    assert "the ledger timed out" in out[0]["message"] and "not re-sent" in out[0]["message"]
    assert len(made(effect_file, text)) == 1  # it did happen: it must not be sent again
    step_name = "mcp.t.fails_after_effect#1"
    parked = await eventually(
        lambda: reconciliation.list_unresolved(client),
        lambda rows: any(r.workflow_id == wid and r.step == step_name for r in rows),
    )
    assert any(r.tool == "mcp.t.fails_after_effect" for r in parked)
    res = await reconciliation.resolve(client, wid, step_name, "landed", result={"text": text})
    assert res.accepted
    assert len(made(effect_file, text)) == 1


async def test_unknown_tool_missing_argument_and_unconfigured_server_send_nothing(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    text = uid()
    _, out = await run(
        client,
        tq,
        step("mcp.t.no_such_tool", text=text),
        step("mcp.t.append"),
        step("mcp.nowhere.append", text=text),
    )
    assert [o.get("error") for o in out] == ["ToolFailed"] * 3
    assert "has no tool 'no_such_tool'" in out[0]["message"] and "append" in out[0]["message"]
    assert "needs the arguments ['text']" in out[1]["message"]
    assert "'nowhere' is not configured" in out[2]["message"]
    assert made(effect_file, text) == []


async def test_a_worker_without_mcp_servers_refuses_clearly(
    worker: Worker, client: Client, tq: str, effect_file: Path
) -> None:
    text = uid()
    _, out = await run(client, tq, step("mcp.t.append", text=text))
    assert out[0]["error"] == "ToolFailed"
    assert "no MCP connections here" in out[0]["message"]
    assert "mcp_servers" in out[0]["message"]
    assert made(effect_file, text) == []


# -- approvals ---------------------------------------------------------------------------------
async def test_approval_binds_the_exact_arguments(
    mcp_worker: tuple[Client, str], effect_file: Path
) -> None:
    client, tq = mcp_worker
    text, refused = uid(), uid()
    handle = await start_agent(client, tq, plan(step("mcp.t.append_approved", text=text)))
    other = await start_agent(client, tq, plan(step("mcp.t.append_approved", text=refused)))
    listed = await eventually(
        lambda: approvals.list_pending(client),
        lambda reqs: {handle.id, other.id} <= {r.workflow_id for r in reqs},
    )
    [req] = [r for r in listed if r.workflow_id == handle.id]
    assert (req.tool, req.step, req.args) == (
        "mcp.t.append_approved",
        "mcp.t.append_approved#1",
        {"text": text},
    )
    assert req.args_hash == exactcall.intent_hash(mcp_app.approved_append, text=text)
    wrong = exactcall.intent_hash(mcp_app.approved_append, text=text + "-evil")
    res = await approvals.approve(client, handle.id, req.step, args_hash=wrong, by="ops")
    assert not res.accepted and res.outcome.startswith("hash mismatch")
    assert made(effect_file, text) == []
    res = await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by="ops")
    assert res.accepted
    assert (await handle.result())[0]["ok"]["text"] == text
    [o_req] = [r for r in listed if r.workflow_id == other.id]
    await approvals.deny(client, other.id, o_req.step, args_hash=o_req.args_hash, reason="no")
    assert (await other.result())[0]["error"] == "ApprovalDenied"
    assert len(made(effect_file, text)) == 1
    assert made(effect_file, refused) == []


# -- crashes -----------------------------------------------------------------------------------
@pytest.mark.crash
async def test_sigkill_right_after_the_effect_gives_one_effect(
    server: DevServer, client: Client, tmp_path: Path
) -> None:
    """Worker A dies after keyed_append ran (the server dedupes on the key: re-called); worker
    B dies after the probed append ran (the probe finds the key: landed); worker C finishes."""
    file, tq = tmp_path / "effects.jsonl", f"mcp-crash-{uid()}"
    keyed, probed = uid(), uid()

    def worker(crash_at: str | None) -> WorkerProcess:
        return WorkerProcess(
            server.address,
            tq,
            tools=["tests.mcp_app"],
            workflows=["tests.workflows"],
            crash_at=crash_at,
            args=mcp_app.worker_args(file),
            cwd=ROOT,
        )

    started = [worker("mcp.t.keyed_append:after_call:1")]
    try:
        await started[0].started()
        handle = await start_agent(
            client,
            tq,
            plan(step("mcp.t.keyed_append", text=keyed), step("mcp.t.append_probed", text=probed)),
        )
        assert await started[0].killed() == -9
        started.append(worker("mcp.t.append_probed:after_call:1"))
        await started[1].started()
        assert await started[1].killed() == -9
        started.append(worker(None))
        await started[2].started()
        out = await handle.result()
    finally:
        for w in started:
            w.stop()
    [k_effect] = made(file, keyed)
    assert out[0]["ok"] == {"line": 1, "text": keyed, "key": k_effect["key"], "replayed": True}
    assert k_effect["key"] == exactcall.derive_key(
        "default", handle.id, "mcp.t.keyed_append#1", "mcp.t.keyed_append", "1"
    )
    assert out[1]["ok"] == {"line": 2, "text": probed}
    assert len(made(file, probed)) == 1


# -- input checks ------------------------------------------------------------------------------
def test_server_specs_and_bad_input_give_clear_errors() -> None:
    name, spec = exactcall.mcp.parse_server_option("bank=python -m 'my server' --x")
    assert (name, spec.command) == ("bank", ("python", "-m", "my server", "--x"))
    assert exactcall.mcp.parse_server_option("b=https://h/mcp")[1].url == "https://h/mcp"
    with pytest.raises(ValueError, match="NAME=COMMAND or NAME=URL"):
        exactcall.mcp.parse_server_option("bank")
    with pytest.raises(ValueError, match="a string is a streamable HTTP URL"):
        exactcall.Plugin(mcp_servers={"bank": "python -m server"})
    with pytest.raises(ValueError, match="letters, digits"):
        exactcall.Plugin(mcp_servers={"my bank": ["python"]})
    with pytest.raises(ValueError, match="unknown keys"):
        exactcall.mcp.server_spec({"command": ["x"], "trusts": True})
    with pytest.raises(ValueError, match="letters, digits"):
        exactcall.mcp.tool("a:b", "append")
    assert exactcall.mcp.server_spec({"command": "srv", "args": ["-v"]}).command == ("srv", "-v")


def test_the_worker_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["worker", "--task-queue", "q", "--tools", "tests.mcp_app"]
    assert cli_main([*base, "--mcp-server", "t=x", "--mcp-trusted", "u"]) == 2
    assert "--mcp-trusted ['u']: no --mcp-server has that name" in capsys.readouterr().err
    assert cli_main([*base, "--mcp-server", "nameonly"]) == 2
    assert "expected NAME=COMMAND or NAME=URL" in capsys.readouterr().err


def test_idempotency_key_reads_meta() -> None:
    key = exactcall.mcp.KEY_META
    assert exactcall.mcp.idempotency_key({key: "k-1"}) == "k-1"
    assert exactcall.mcp.idempotency_key({}) is None
    assert exactcall.mcp.idempotency_key(None) is None
    with pytest.raises(ValueError, match="malformed idempotency key"):
        exactcall.mcp.idempotency_key({key: 7})
    with pytest.raises(TypeError, match="takes an MCP tool's Context"):
        exactcall.mcp.idempotency_key(42)
