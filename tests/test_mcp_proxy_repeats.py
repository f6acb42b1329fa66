"""``exactcall mcp proxy`` tells a retry from a deliberate repeat: a repeat whose earlier answer
reached the client runs; a retry (the earlier call still running, or its answer never
delivered: cancelled, disconnected, the proxy stopped) gets the earlier outcome and runs
nothing, and the model reads so. Counted at the destination (tests/mcp_proxy_servers.py)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowHistory, WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.worker import Replayer

import exactcall
from exactcall._worker import build_worker
from exactcall.cli._main import main as cli_main
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows
from exactcall.mcp._proxy_workflow import (
    LINGER,
    MCP_PROXY_NEXT_SIGNAL,
    MCP_PROXY_OWNED_WORKFLOW,
    MCP_PROXY_OWNER_ALIVE_SIGNAL,
    MCP_PROXY_OWNER_REPORT_SIGNAL,
    MCP_PROXY_TOOL,
    MCP_PROXY_WAIT_UPDATE,
    OWNER_DELAY,
    OWNER_LEASE,
    ApprovedProxyCall,
    CallInput,
    Outcome,
    OwnedProxyCall,
    ProxyCall,
    Report,
    Wait,
    owned_key,
)
from tests.mcp_proxy_client import (
    DEDUP,
    OUTCOME,
    eventually,
    fresh,
    meta,
    proxied,
    proxy_args,
    read_lines,
    spawn_raw,
    text,
)

HISTORIES = Path(__file__).parent / "histories" / "mcp"


async def test_deliberate_repeats_run_every_time(server: DevServer, tmp_path: Path) -> None:
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        for content in ("A", "B", "A"):
            wrote = await p.client.call_tool("write_file", {"content": content})
            assert not wrote.is_error and DEDUP not in meta(wrote)
        for on in (False, True, False):
            await p.client.call_tool("set_logging", {"on": on})
        first = await p.client.call_tool("increment", {})
        second = await p.client.call_tool("increment", {})
        third = await p.client.call_tool("increment", {})
    assert Path(f"{p.effects}.content").read_text() == "A" and p.count("write_file") == 3
    toggles = [ln.split()[1] for ln in p.effects.read_text().splitlines() if "set_logging" in ln]
    assert toggles == ["off", "on", "off"]
    assert p.count("increment") == 3
    assert [text(r) for r in (first, second, third)] == ["count is 1", "count is 2", "count is 3"]


async def _events(client: TemporalClient, wid: str) -> list[Any]:
    return [e async for e in client.get_workflow_handle(wid).fetch_history_events()]


async def test_a_write_is_sent_by_its_proxy_and_recorded_before_and_after(
    server: DevServer, client: TemporalClient, tmp_path: Path
) -> None:
    """The fast path: the proxy starts the call's run (the intent, in its input), sends the
    call itself with the derived key (no activity), and reports the outcome to the run."""
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        r = await p.client.call_tool("append", {"line": "own"})
        wid, step = await _audited(p)
        assert p.keys("append") == [owned_key("default", wid, step)]
        assert (
            await client.get_workflow_handle(wid).describe()
        ).workflow_type == MCP_PROXY_OWNED_WORKFLOW
        # the run ends after its start delay and the linger, on the proxy's worker
        done = await client.get_workflow_handle(wid, result_type=Outcome).result()
    assert not r.is_error and p.count("append") == 1
    assert done.kind == "done" and done.result is not None
    assert done.result["content"][0]["text"] == text(r)  # what the client read is recorded
    events = await _events(client, wid)
    kinds = [e.WhichOneof("attributes") for e in events]
    assert not any("activity_task" in k for k in kinds)  # sent by the proxy, not an activity
    assert _signals(events) == [MCP_PROXY_OWNER_REPORT_SIGNAL]
    # its start delay outlasts the linger: the whole run is one workflow task, no timer
    assert kinds.count("workflow_task_completed_event_attributes") == 1
    assert "timer_started_event_attributes" not in kinds
    # `exactcall audit` reads it from Temporal alone, as it reads a tool activity
    rows = [r async for r in audit_rows(client, AuditFilter(workflow=wid))]
    assert [(r["tool"], r["step"], r["outcome"], r["key"]) for r in rows] == [
        (MCP_PROXY_TOOL, step, "done", owned_key("default", wid, step))
    ]
    assert rows[0]["args"]["tool"] == "append" and rows[0]["args"]["arguments"] == {"line": "own"}


@pytest.mark.crash
async def test_a_write_longer_than_the_lease_is_kept_alive_and_done(
    server: DevServer, client: TemporalClient, tmp_path: Path
) -> None:
    """A write the server takes longer than the lease over is not taken for a dead proxy:
    the proxy's keepalives hold it; it is done, once, and a retry is not needed."""
    seconds = OWNER_LEASE.total_seconds() + 2
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        r = await p.client.call_tool("slow_append", {"line": "long", "seconds": seconds})
        wid, _ = await _audited(p)
        done = await client.get_workflow_handle(wid, result_type=Outcome).result()
    assert not r.is_error and p.count("slow_append") == 1
    assert done.kind == "done"
    events = await _events(client, wid)
    names = _signals(events)
    assert names.count(MCP_PROXY_OWNER_ALIVE_SIGNAL) >= int(seconds) - 1
    assert names[-1] == MCP_PROXY_OWNER_REPORT_SIGNAL
    assert not any(
        e.HasField("start_child_workflow_execution_initiated_event_attributes") for e in events
    )


async def _audited(p: Any) -> tuple[str, str]:
    """The workflow id and step of the proxy's last call, from its audit (written just
    after the answer)."""
    await eventually(lambda: p.audit.exists() and bool(p.audit_rows()))
    row = p.audit_rows()[-1]
    assert row["outcome"] == "executed"
    return row["workflow_id"], row["step"]


def _signals(events: list[Any]) -> list[str]:
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]


async def test_three_concurrent_identical_copies_run_once(
    server: DevServer, tmp_path: Path
) -> None:
    args = {"line": "c3", "seconds": 0.5}
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        results = await asyncio.gather(*(p.client.call_tool("slow_append", args) for _ in range(3)))
        after = await p.client.call_tool("slow_append", args)  # answered: a new call
    assert p.count("slow_append") == 2
    ran = [r for r in results if DEDUP not in meta(r)]
    assert len(ran) == 1 and not any(r.is_error for r in results)
    for r in results:
        if r is not ran[0]:
            assert "already in progress" in text(r) and text(r).endswith(text(ran[0]))
    assert DEDUP not in meta(after)


async def test_a_copy_sent_before_the_answer_was_delivered_is_a_retry_wherever_it_arrives(
    server: DevServer, client: TemporalClient, tmp_path: Path
) -> None:
    """Another proxy's copy, sent while the call ran but slowed on its way (a loaded machine),
    reaches the run after the first answer was delivered: it gets that outcome and runs
    nothing. A copy sent after the delivery asks for a new run, and the run ends for it."""
    async with proxied(tmp_path, name=fresh(), address=server.address) as p:
        before = time.time()
        first = await p.client.call_tool("append", {"line": "late"})
        after = time.time()
        [row] = p.audit_rows()
        handle = client.get_workflow_handle(row["workflow_id"], result_type=Outcome)

        def wait(caller: str, sent_at: float) -> Wait:
            return Wait(
                caller=caller, args_hash=row["args_hash"], timeout_seconds=5, sent_at=sent_at
            )

        # the delivered signal went out once the answer was written: the run knows it then
        for _ in range(200):
            if await _delivered(handle):
                break
            await asyncio.sleep(0.05)
        late = await handle.execute_update(
            MCP_PROXY_WAIT_UPDATE, wait("late", before), result_type=Outcome
        )
        assert late.kind == "done" and late.deduplicated and late.repeat == "running"
        assert late.result is not None and late.step == row["step"] and not first.is_error
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                MCP_PROXY_WAIT_UPDATE, wait("new", after), result_type=Outcome
            )
        assert getattr(refused.value.cause, "type", None) == "Delivered"
        asked = time.monotonic()
        await handle.signal(MCP_PROXY_NEXT_SIGNAL)
        assert (await handle.result()).kind == "done"
        assert time.monotonic() - asked < LINGER.total_seconds()  # ended for the new call
        again = await p.client.call_tool("append", {"line": "late"})  # a new call: it runs
    assert DEDUP not in meta(again) and p.count("append") == 2


@pytest.mark.parametrize("sent", ["before", "after"])
async def test_a_copy_that_comes_before_the_report_is_told_by_when_it_was_sent(
    client: TemporalClient, sent: str
) -> None:
    """An owned run's first task can hold both an identical copy and the owner's report
    (its start is delayed). The copy is a retry only if its client sent it before the first
    answer was delivered; sent after, it is refused (a new call: its proxy starts a new run)."""
    tq, wid = f"q-{fresh()}", f"owned-{fresh()}"
    inp = CallInput(
        server="s",
        tool="append",
        arguments={"line": "x"},
        args_hash="a" * 64,
        step="append@1",
        window_seconds=None,
        caller="owner",
        mode="retry",
        hold_seconds=60,
    )
    async with build_worker(client, tq, [OwnedProxyCall]):
        handle = await client.start_workflow(
            OwnedProxyCall.run, inp, id=wid, task_queue=tq, start_delay=OWNER_DELAY
        )
        copy_sent = time.time()
        delivered = copy_sent - 1 if sent == "after" else copy_sent + 1
        copy = Wait(caller="copy", args_hash="a" * 64, timeout_seconds=20, sent_at=copy_sent)
        waiting = await handle.start_update(
            MCP_PROXY_WAIT_UPDATE,
            copy,
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=Outcome,
        )
        result = {"content": [{"type": "text", "text": "appended"}], "isError": False}
        report = Report(kind="done", result=result, delivered_at=delivered, delivered_after=0.01)
        await handle.signal(MCP_PROXY_OWNER_REPORT_SIGNAL, report)
        if sent == "after":
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await waiting.result()
            assert getattr(refused.value.cause, "type", None) == "Delivered"
        else:
            got = await waiting.result()
            assert got.kind == "done" and got.deduplicated and got.repeat == "running"
            assert got.result == result
        await handle.signal(MCP_PROXY_NEXT_SIGNAL)  # what the refused copy's proxy sends: it ends
        assert (await handle.result()).kind == "done"


async def _delivered(handle: Any) -> bool:
    async for e in handle.fetch_history_events():
        if e.HasField("workflow_execution_signaled_event_attributes"):
            return True
    return False


class RawSession:
    """A proxy process driven line by line, as a client that may vanish mid-call."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.proc = spawn_raw(args, tmp_path)
        self.out: list[bytes] = []
        self.reader = threading.Thread(target=read_lines, args=(self.proc, self.out), daemon=True)
        self.reader.start()

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def answers(self, rid: Any) -> list[dict[str, Any]]:
        found = []
        for line in list(self.out):
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == rid:
                found.append(msg)
        return found

    async def open(self) -> None:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        await eventually(lambda: self.answers(1))
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, rid: int, tool: str, arguments: dict[str, Any]) -> None:
        params = {"name": tool, "arguments": arguments}
        self.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})

    async def wait(self) -> int:
        code = await asyncio.to_thread(self.proc.wait, 60)
        self.reader.join(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return code


@pytest.mark.crash
@pytest.mark.parametrize("how", ["sigterm", "eof"])
async def test_shutdown_during_a_write_never_answers_failed_and_a_retry_gets_it(
    server: DevServer, tmp_path: Path, how: str
) -> None:
    name, effects = fresh(), tmp_path / "stop.effects"
    args = {"line": "t", "seconds": 1.0}
    raw = RawSession(
        proxy_args(name, tmp_path / "a.audit", (), server.address, "effects", effects), tmp_path
    )
    await raw.open()
    raw.call(2, "slow_append", args)
    await eventually(Path(f"{effects}.started").exists)
    if how == "sigterm":
        raw.proc.send_signal(signal.SIGTERM)
    else:
        assert raw.proc.stdin is not None
        raw.proc.stdin.close()
    assert await raw.wait() == 0  # documented: a client that ends the proxy gets 0
    if raw.proc.stdin and not raw.proc.stdin.closed:
        raw.proc.stdin.close()
    for answer in raw.answers(2):  # the write was let finish; never a made-up failure
        assert not answer["result"].get("isError"), answer
    count = sum(1 for ln in effects.read_text().splitlines() if ln.startswith("slow_append"))
    assert count == 1
    # the client comes back and retries: the first outcome, nothing run again
    async with proxied(tmp_path, name=name, address=server.address, effects=effects) as p:
        again = await p.client.call_tool("slow_append", args)
        later = await p.client.call_tool("slow_append", args)  # delivered now: a new call
    assert not again.is_error and meta(again)[DEDUP] is True
    assert "never reached a client" in text(again) and "nothing was sent" in text(again)
    assert DEDUP not in meta(later) and p.count("slow_append") == 2


async def test_a_cancelled_write_gets_no_response_and_the_server_gets_the_cancel(
    server: DevServer, tmp_path: Path
) -> None:
    name, upstream_log = fresh(), tmp_path / "raw.log"
    raw = RawSession(
        proxy_args(name, tmp_path / "c.audit", (), server.address, "raw", upstream_log), tmp_path
    )
    try:
        await raw.open()
        raw.call(7, "hang", {"n": 1})

        def sent() -> list[dict[str, Any]]:
            rows = [json.loads(ln) for ln in upstream_log.read_text().splitlines() if ln]
            return [r for r in rows if isinstance(r, dict)]

        await eventually(lambda: [r for r in sent() if r.get("method") == "tools/call"])
        proxy_id = next(r["id"] for r in sent() if r.get("method") == "tools/call")
        assert proxy_id != 7
        cancel = {"requestId": 7, "reason": "the user pressed stop"}
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        cancels = await eventually(
            lambda: [r for r in sent() if r.get("method") == "notifications/cancelled"]
        )
        # under the id the server saw (the proxy's), not the client's
        assert [c["params"]["requestId"] for c in cancels] == [proxy_id]
        raw.call(8, "poke", {"n": 2})  # the proxy goes on serving
        await eventually(lambda: raw.answers(8))
        await asyncio.sleep(4.0)  # past the proxy's grace for the server's answer
        assert raw.answers(7) == []  # MCP: a cancelled request gets no response
        # sent and never answered: unknown, and a retry is told so, never re-sent
        raw.call(9, "hang", {"n": 1})
        retry = await eventually(lambda: raw.answers(9), 60)
        assert retry[0]["result"]["_meta"][OUTCOME] == "unknown"
        assert len([r for r in sent() if r.get("method") == "tools/call"]) == 2  # hang + poke
        wid = retry[0]["result"]["_meta"]["io.exactcall/workflow-id"]
        step = retry[0]["result"]["_meta"]["io.exactcall/step"]
        # settled while the proxy (whose worker confirms it) runs, as the docs say
        settle = ["resolve", wid, step, "--landed", "--result", '"done"', "--yes"]
        assert await asyncio.to_thread(cli_main, [*settle, "--address", server.address]) == 0
    finally:
        if raw.proc.stdin:
            raw.proc.stdin.close()
        await raw.wait()


@pytest.mark.parametrize(
    "name",
    [
        # before retries and repeats were told apart (a ProxyCall input without a mode)
        "proxy_call_window",
        # mode retry, before a delivered run lingered for earlier copies (it ended at delivery)
        "proxy_call_retry",
        # sent by the proxy itself: answered and delivered, a concurrent copy attached
        "proxy_owned_call",
        # sent by the proxy itself, which was killed mid-write: unknown, settled as landed
        "proxy_owned_unknown",
        # a tool given to --approve, before its wait saw the approval request at once
        # (exactcall.mcp.approval-seen): waited for, approved, then delivered
        "proxy_approved_call",
    ],
)
async def test_a_proxy_call_history_of_an_older_shape_replays(name: str) -> None:
    """Recorded by an earlier proxy: it replays on today's workflows."""
    history = json.loads((HISTORIES / f"{name}.json").read_text())
    replayer = Replayer(
        workflows=[ProxyCall, ApprovedProxyCall, OwnedProxyCall],
        plugins=[exactcall.Plugin(tools=[])],
        namespace="default",
    )
    # its own workflow id: the key a reconciliation is started with is derived from it
    wid = history["events"][0]["workflowExecutionStartedEventAttributes"].get("workflowId", name)
    await replayer.replay_workflow(WorkflowHistory.from_json(wid, history))


@pytest.mark.parametrize(
    ("name", "outcome", "verdict"),
    [("proxy_owned_call", "done", None), ("proxy_owned_unknown", "done", "landed")],
)
async def test_the_audit_reads_a_call_the_proxy_sent_itself(
    name: str, outcome: str, verdict: str | None
) -> None:
    """From the stored histories alone: the intent (the run's input), the derived key, and the
    outcome (the proxy's report, or the verdict of the reconciliation of a killed proxy's
    call)."""
    from temporalio.converter import DataConverter

    from exactcall._calls import calls_in_history

    history = json.loads((HISTORIES / f"{name}.json").read_text())
    wid = history["events"][0]["workflowExecutionStartedEventAttributes"]["workflowId"]
    calls = await calls_in_history(WorkflowHistory.from_json(wid, history), DataConverter.default)
    [call] = calls
    assert (call.tool, call.outcome, call.verdict) == (MCP_PROXY_TOOL, outcome, verdict)
    assert call.key == owned_key("default", wid, call.step) and call.args["tool"] == "slow_append"
    assert call.ended_at is not None and call.time <= call.ended_at
