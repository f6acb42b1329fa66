"""The approvals CLI and the plain ``temporal workflow signal`` command, as a person uses them."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from temporalio.client import Client
from temporalio.worker import Worker

import exactcall
from exactcall import approvals
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer, temporal_binary
from exactcall.testing import WorkerProcess
from tests.conftest import ROOT, plan, start_agent, step
from tests.test_approvals import eventually, pending_of


async def cli(server: DevServer, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        *args,
        "--address",
        server.address,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_list_show_approve_and_exit_codes(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)

    async def listed() -> list[dict[str, Any]]:
        rc, out, _ = await cli(server, "approvals", "list", "--json")
        assert rc == 0
        return [r for r in json.loads(out) if r["workflow_id"] == handle.id]

    [row] = await eventually(listed, lambda rows: len(rows) == 1)
    assert {
        "workflow_id",
        "step",
        "tool",
        "args",
        "args_hash",
        "requested_at",
        "expires_at",
    } <= set(row)
    assert row["args"] == req.args and row["args_hash"] == req.args_hash

    rc, out, _ = await cli(server, "approvals", "show", handle.id)
    assert rc == 0 and req.args_hash in out and f'"to": "{who}"' in out

    # no terminal and no --yes: refused, nothing sent
    rc, _, err = await cli(server, "approve", handle.id, req.step, "--hash", req.args_hash)
    assert rc == 2 and "--yes" in err
    # a wrong hash: sent, rejected and recorded, exit 1
    wrong = exactcall.intent_hash("transfer", bank.url, 9999, "mallory")
    rc, _, err = await cli(server, "approve", handle.id, "--hash", wrong, "--yes", "--as", "eve")
    assert rc == 1 and "hash mismatch" in err
    # missing --hash: usage error
    rc, _, _ = await cli(server, "approve", handle.id, "--yes")
    assert rc == 2
    rc, out, _ = await cli(
        server,
        "approve",
        handle.id,
        req.step,
        "--hash",
        req.args_hash,
        "--yes",
        "--as",
        "ops",
        "--reason",
        "invoice 42",
    )
    assert rc == 0 and "accepted" in out
    await handle.result()
    # a double click: the call is no longer pending
    rc, _, err = await cli(server, "approve", handle.id, req.step, "--hash", req.args_hash, "--yes")
    assert rc == 1 and "no step" in err and "approved" in err
    decisions = (await approvals.view(client, handle.id)).decisions
    assert [(d.decision.by, d.accepted) for d in decisions] == [("eve", False), ("ops", True)]
    assert decisions[1].decision.reason == "invoice 42"
    assert bank.count(to=who) == 1


async def test_deny_and_preapprove_from_the_cli(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    p = plan(
        step("transfer", bank.url, 10, who), step("transfer", bank.url, 20, who), wait_first=True
    )
    handle = await start_agent(client, tq, p)
    args = json.dumps({"bank": bank.url, "amount": 10, "to": who})
    rc, out, _ = await cli(
        server, "approve", handle.id, "--tool", "transfer", "--args", args, "--yes"
    )
    # the workflow has made no exactcall call yet: sent, checked at its first call (exit 3)
    assert rc == 3, out
    assert "sent; queued until the workflow's first exactcall call, which checks it" in out
    assert exactcall.intent_hash("transfer", bank.url, 10, who) in out
    await handle.signal("go")
    second = await pending_of(client, handle)
    assert second.step == "transfer#2"
    rc, _, _ = await cli(
        server,
        "deny",
        handle.id,
        second.step,
        "--hash",
        second.args_hash,
        "--yes",
        "--reason",
        "too much",
    )
    assert rc == 0
    out = await handle.result()
    assert out[0]["ok"]["amount"] == 10
    assert out[1]["error"] == "ApprovalDenied" and "too much" in out[1]["message"]
    assert bank.count(to=who) == 1


async def test_signed_approval_from_the_cli(
    server: DevServer, tq: str, bank: Bank, who: str, tmp_path: Any
) -> None:
    from exactcall._worker import Connection, connect
    from tests.conftest import running_worker

    key = Ed25519PrivateKey.generate()
    keyfile = tmp_path / "ops.pem"
    keyfile.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    plugin = exactcall.Plugin(approver_keys={"ops": key.public_key()})
    client = await connect(Connection(address=server.address), plugin)
    async with running_worker(client, tq):
        handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
        req = await pending_of(client, handle)
        h = req.args_hash
        rc, _, err = await cli(server, "approve", handle.id, "--hash", h, "--yes", "--as", "ops")
        assert rc == 1 and "unsigned" in err
        rc, _, err = await cli(
            server,
            "approve",
            handle.id,
            "--hash",
            h,
            "--yes",
            "--as",
            "ops",
            "--key",
            str(keyfile),
        )
        assert rc == 0, err
        await handle.result()
    assert bank.count(to=who) == 1


async def test_plain_temporal_cli_signal_approves(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    payload = json.dumps(
        {"decision": "approve", "args_hash": req.args_hash, "step": req.step, "by": "oncall"}
    )
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "signal",
        "--address",
        server.address,
        "--workflow-id",
        handle.id,
        "--name",
        approvals.DECIDE_SIGNAL,
        "--input",
        payload,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    result = await handle.result()
    assert result[0]["ok"]["to"] == who
    [rec] = (await approvals.view(client, handle.id)).decisions
    assert rec.accepted and rec.decision.by == "oncall"
    assert bank.count(to=who) == 1


@pytest.mark.crash
@pytest.mark.parametrize("when", ["while_waiting", "right_after_the_signal", "during_the_effect"])
async def test_crashes_keep_the_approval_and_run_once(
    when: str,
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    crash = "transfer:after_call:1" if when == "during_the_effect" else None
    a = await worker_process(tq, crash_at=crash).started()
    handle = await start_agent(
        client, tq, plan(step("transfer", bank.url, 10, who, on_unknown="raise"))
    )
    req = await pending_of(client, handle)
    if when == "while_waiting":
        a.stop()
        await worker_process(tq).started()
    await client.get_workflow_handle(handle.id).signal(
        approvals.DECIDE_SIGNAL,
        approvals.Decision(decision="approve", args_hash=req.args_hash, step=req.step, by="ops"),
    )
    if when == "right_after_the_signal":
        a.stop()
    if when != "while_waiting":
        await worker_process(tq).started()
    out = await handle.result()
    if when == "during_the_effect":  # killed after the payment, before its result was recorded
        assert out[0]["error"] == "AmbiguousOutcome"
    else:
        assert out[0]["ok"]["to"] == who
    [rec] = (await approvals.view(client, handle.id)).decisions
    assert rec.accepted
    assert bank.count(to=who) == 1


@pytest.mark.crash
async def test_two_workers_and_racing_approvers_give_one_effect(
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    await worker_process(tq).started()
    await worker_process(tq).started()
    handles = [
        await start_agent(client, tq, plan(step("transfer", bank.url, 10, f"{who}-{i}")))
        for i in range(3)
    ]
    for i, handle in enumerate(handles):
        req = await pending_of(client, handle)
        results = await asyncio.gather(
            *(
                approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by=f"op{n}")
                for n in range(4)
            )
        )
        assert sum(r.accepted for r in results) == 1
        assert (await handle.result())[0]["ok"]["to"] == f"{who}-{i}"
        assert bank.count(to=f"{who}-{i}") == 1


async def test_the_listed_hash_prefix_approves_and_a_wrong_one_sends_nothing(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    # a prefix that is not this call's: refused before anything is sent
    wrong = exactcall.intent_hash("transfer", bank.url, 9999, "mallory")[:12]
    rc, _, err = await cli(server, "approve", handle.id, "--hash", wrong, "--yes")
    assert rc == 2 and "nothing sent" in err and req.args_hash in err
    assert (await approvals.view(client, handle.id)).decisions == []
    # the 12 characters `approvals list` prints: the full hash is shown, then used
    rc, out, err = await cli(server, "approve", handle.id, "--hash", req.args_hash[:12], "--yes")
    assert rc == 0, err
    assert f"is the start of this call's hash: {req.args_hash}" in out and "accepted" in out
    out_ = await handle.result()
    assert out_[0]["ok"]["to"] == who and bank.count(to=who) == 1
    # a reason sent after the decision is not silently lost: the CLI says so, and where it goes
    rc, _, err = await cli(
        server, "approve", handle.id, "--hash", req.args_hash, "--reason", "ok'd by phone", "--yes"
    )
    assert rc == 1, err
    assert "last accepted decision: approved" in err and "no reason given" in err
    assert "your reason was not recorded" in err and "--reason" in err
