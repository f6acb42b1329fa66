"""``exactcall audit``, its export and verify: every outcome and approver read back from
Temporal alone (a real server, real workers, real approvals and a real reconciliation)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowHandle

import exactcall
from exactcall import approvals, reconciliation
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows, key_id, verify
from tests import audit_app as audit_app
from tests.conftest import ROOT, plan, running_worker, start_agent, step
from tests.test_approvals import eventually, pending_of


@dataclass
class Audited:
    prefix: str
    ids: dict[str, str]
    alice: Ed25519PrivateKey
    keys_dir: Path
    who: str


async def _decided(client: Client, h: WorkflowHandle[Any, Any], verb: str, **kw: Any) -> None:
    req = await pending_of(client, h)
    fn = approvals.approve if verb == "approve" else approvals.deny
    res = await fn(client, h.id, req.step, args_hash=req.args_hash, **kw)
    assert res.accepted, res.outcome


@pytest.fixture(scope="module")
async def audited(
    server: DevServer, client: Client, bank: Bank, tmp_path_factory: pytest.TempPathFactory
) -> Audited:
    prefix = f"audit-{uuid.uuid4().hex[:8]}-"
    who = f"acct-{uuid.uuid4().hex[:8]}"
    alice = Ed25519PrivateKey.generate()
    keys_dir = tmp_path_factory.mktemp("keys")
    (keys_dir / "alice.pem").write_bytes(
        alice.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (keys_dir / "alice.pub.pem").write_bytes(
        alice.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    signed = await connect(
        Connection(address=server.address),
        exactcall.Plugin(approver_keys={"alice": alice.public_key()}),
    )
    tq, tq_signed = f"tq-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4().hex[:8]}"
    ids = {}

    async def agent(name: str, *steps: dict[str, Any], on: Client = client, q: str = tq) -> Any:
        ids[name] = prefix + name
        return await start_agent(on, q, plan(*steps), wid=prefix + name)

    async with running_worker(client, tq), running_worker(signed, tq_signed):
        done = await agent("done", step("pay", bank.url, 10, who))
        failed = await agent("failed", step("declined_pay", bank.url, 11, who))
        unknown = await agent(
            "unknown", step("explode_after_paying", bank.url, 12, who, on_unknown="raise")
        )
        denied = await agent("denied", step("transfer", bank.url, 13, who))
        expired = await agent("expired", step("hasty_transfer", bank.url, 14, who))
        unsigned = await agent("unsigned", step("transfer", bank.url, 15, who))
        signed_h = await agent(
            "signed", step("transfer", bank.url, 16, who), on=signed, q=tq_signed
        )
        await _decided(client, denied, "deny", by="bob", reason="not this month")
        await _decided(client, unsigned, "approve", by="carol")
        await _decided(signed, signed_h, "approve", by="alice", signing_key=alice)
        for h in (done, failed, unknown, denied, expired, unsigned, signed_h):
            await asyncio.wait_for(h.result(), 60)
        row = await eventually(
            lambda: reconciliation.find(client, unknown.id, "explode_after_paying#1"),
            lambda r: r is not None,
            timeout=30,
        )
        res = await reconciliation.resolve(
            client, unknown.id, row.step, "landed", result={"found": "by hand"}, by="ops"
        )
        assert res.accepted, res.outcome
        await eventually(
            lambda: reconciliation.list_unresolved(client),
            lambda rows: all(r.workflow_id != unknown.id for r in rows),
            timeout=30,
        )
    return Audited(prefix, ids, alice, keys_dir, who)


async def _rows(client: Client, a: Audited, **kw: Any) -> list[dict[str, Any]]:
    flt = AuditFilter(workflow=a.prefix + "*", **kw)
    keys = {"alice": a.alice.public_key()}
    return [r async for r in audit_rows(client, flt, approver_keys=keys)]


async def test_every_outcome_and_approver(client: Client, audited: Audited) -> None:
    rows = {r["workflow_id"][len(audited.prefix) :]: r for r in await _rows(client, audited)}
    assert set(rows) == set(audited.ids), rows.keys()
    outcomes = {name: r["outcome"] for name, r in rows.items()}
    assert outcomes == {
        "done": "done",
        "failed": "failed",
        "unknown": "done",
        "denied": "denied",
        "expired": "expired",
        "unsigned": "done",
        "signed": "done",
    }
    assert rows["failed"]["error"].startswith("NotExecuted: card declined for 11")
    assert (rows["unknown"]["verdict"], rows["unknown"]["settled_by"]) == ("landed", "ops")
    assert rows["done"]["verdict"] is None and rows["done"]["approved_by"] == []
    assert rows["denied"]["denied_by"]["name"] == "bob"
    assert rows["denied"]["reason"] == "not this month"
    assert rows["expired"]["denied_by"] is None and rows["expired"]["approved_by"] == []
    [carol] = rows["unsigned"]["approved_by"]
    assert (carol["name"], carol["signed"], carol["key_id"]) == ("carol", False, None)
    [alice] = rows["signed"]["approved_by"]
    assert (alice["name"], alice["signed"]) == ("alice", True)
    assert alice["key_id"] == key_id(audited.alice.public_key())
    assert alice["signature"] == "valid"
    for r in rows.values():
        assert r["args"]["amount"] in range(10, 17) and r["args"]["to"] == audited.who
        assert r["args_hash"] and r["key"] and r["run_id"] and r["time"]
    # what ran is what the bank saw: done, unknown-then-landed, and the two approved
    assert {r["args"]["amount"] for r in rows.values() if r["outcome"] == "done"} == {
        10,
        12,
        15,
        16,
    }


async def test_filters(client: Client, audited: Audited, bank: Bank) -> None:
    assert bank.count(to=audited.who) == 4
    only = await _rows(client, audited, tools=("transfer",))
    assert sorted(r["workflow_id"] for r in only) == sorted(
        audited.prefix + n for n in ("denied", "unsigned", "signed")
    )
    unknown = await _rows(client, audited, outcome="unknown")
    assert [r["workflow_id"] for r in unknown] == [audited.prefix + "unknown"]
    denied = await _rows(client, audited, outcome="denied", redact=True)
    assert len(denied) == 1 and denied[0]["args"] is None and denied[0]["args_hash"]
    assert len(await _rows(client, audited, limit=2)) == 2
    exact = AuditFilter(workflow=audited.prefix + "done")
    one = [r async for r in audit_rows(client, exact)]
    assert [r["workflow_id"] for r in one] == [audited.prefix + "done"]


def _cli(*args: str, server: DevServer | None = None) -> subprocess.CompletedProcess[str]:
    conn = ["--address", server.address] if server is not None else []
    return subprocess.run(
        [sys.executable, "-m", "exactcall", *args, *conn],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "EXACTCALL_LOG_LEVEL": "WARNING"},
        timeout=120,
    )


async def test_cli_text_json_csv(server: DevServer, audited: Audited) -> None:
    wf = ["--workflow", audited.prefix + "*"]
    text = await asyncio.to_thread(_cli, "audit", *wf, server=server)
    assert text.returncode == 0, text.stderr
    assert "denied by bob" in text.stdout and "not this month" in text.stdout
    assert "(unknown, then landed by ops)" in text.stdout
    assert "7 calls" in text.stdout.splitlines()[-1]
    js = await asyncio.to_thread(_cli, "audit", "--json", *wf, server=server)
    lines = [json.loads(x) for x in js.stdout.splitlines()]
    assert len(lines) == 7 and {x["outcome"] for x in lines} >= {"done", "denied", "expired"}
    cs = await asyncio.to_thread(_cli, "audit", "--csv", "--redact", *wf, server=server)
    header, *body = cs.stdout.splitlines()
    assert header.startswith("time,workflow_id,run_id,step,tool,args,")
    assert len(body) == 7 and str(audited.who) not in cs.stdout  # redacted: no args
    bad = await asyncio.to_thread(_cli, "audit", "--since", "yesterday", server=server)
    assert bad.returncode == 2 and "is not a time" in bad.stderr


async def test_export_then_verify_and_every_tampering(
    server: DevServer, audited: Audited, tmp_path: Path
) -> None:
    out = tmp_path / "audit.jsonl"
    key = audited.keys_dir / "alice.pem"
    wf = ["--workflow", audited.prefix + "*"]
    ex = await asyncio.to_thread(
        _cli, "audit", "export", "--out", str(out), "--sign", str(key), *wf, server=server
    )
    assert ex.returncode == 0, ex.stderr
    assert "exported 7 calls" in ex.stdout
    pub = audited.keys_dir / "alice.pub.pem"
    ok = await asyncio.to_thread(_cli, "audit", "verify", str(out), "--key", str(pub))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("intact: 7 calls, signed by ed25519:")

    # deterministic: a second export of the same closed calls has the same call lines
    again = tmp_path / "again.jsonl"
    ex2 = await asyncio.to_thread(_cli, "audit", "export", "--out", str(again), *wf, server=server)
    assert ex2.returncode == 0, ex2.stderr
    assert out.read_text().splitlines()[:-1] == again.read_text().splitlines()[:-1]

    lines = out.read_text().splitlines()
    pubkey = audited.alice.public_key()

    def tampered(name: str, new: list[str], *, end: str = "\n") -> Any:
        p = tmp_path / f"{name}.jsonl"
        p.write_text("\n".join(new) + end)
        return verify(p, pubkey)

    altered = json.loads(lines[3])
    altered["args"]["amount"] += 1
    v = tampered("altered", [*lines[:3], json.dumps(altered, sort_keys=True), *lines[4:]])
    assert not v.ok and v.line == 4 and "line 4 was altered" in v.problem
    v = tampered("deleted", [*lines[:3], *lines[4:]])
    assert not v.ok and v.line == 4 and "call 3 removed" in v.problem
    v = tampered("inserted", [*lines[:3], lines[2], *lines[3:]])
    assert not v.ok and v.line == 4 and "inserted" in v.problem, v.problem
    v = tampered("swapped", [*lines[:2], lines[3], lines[2], *lines[4:]])
    assert not v.ok and v.line == 3 and "reordered" in v.problem, v.problem
    v = tampered("truncated", lines[:5])
    assert not v.ok and "truncated" in v.problem
    v = tampered("cut", [*lines[:4], lines[4][:40]], end="")
    assert not v.ok and v.line == 5 and "cut off" in v.problem
    v = tampered("last_removed", [*lines[:-2], lines[-1]])
    assert not v.ok and "counts 7 calls, the file has 6" in v.problem, v.problem

    mallory = Ed25519PrivateKey.generate()
    v = verify(out, mallory.public_key())
    assert not v.ok and v.signature == "invalid" and "does not match" in v.problem
    assert verify(out).signature == "not checked" and verify(out).ok

    # the CLI's exit codes: 1 for a changed file, 2 for something that is not an export
    changed = tmp_path / "deleted.jsonl"
    res = await asyncio.to_thread(_cli, "audit", "verify", str(changed), "--key", str(pub))
    assert res.returncode == 1 and "CHANGED: call 3 removed" in res.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    res = await asyncio.to_thread(_cli, "audit", "verify", str(notes))
    assert res.returncode == 2 and "not an exactcall audit export" in res.stderr
    res = await asyncio.to_thread(_cli, "audit", "verify", str(again), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["signature"] == "absent"
