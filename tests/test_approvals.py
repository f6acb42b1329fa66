"""Approvals bound to the exact arguments, on a real server (signals, queries, visibility)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

import exactcall
from exactcall import approvals
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from tests.conftest import plan, running_worker, start_agent, step
from tests.workflows import Forge

T = TypeVar("T")


async def eventually(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float = 10
) -> T:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            value = await fn()
            if ok(value):
                return value
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: last value {value!r}")
        await asyncio.sleep(0.1)


async def pending_of(client: Client, handle: WorkflowHandle[Any, Any]) -> approvals.ApprovalRequest:
    """The one call of ``handle`` waiting for approval (polls the query)."""
    v = await eventually(lambda: approvals.view(client, handle.id), lambda v: len(v.pending) == 1)
    return v.pending[0]


async def test_pending_call_is_visible_by_query_and_listable(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    assert (req.workflow_id, req.step, req.tool) == (handle.id, "transfer#1", "transfer")
    assert req.args == {"bank": bank.url, "amount": 10, "to": who}
    assert req.args_hash == exactcall.intent_hash("transfer", bank.url, 10, who)
    assert req.expires_at > req.requested_at
    listed = await eventually(
        lambda: approvals.list_pending(client),
        lambda reqs: any(r.workflow_id == handle.id for r in reqs),
    )
    assert [r for r in listed if r.workflow_id == handle.id] == [req]
    assert bank.count(to=who) == 0
    await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by="ops")
    await handle.result()
    listed = await eventually(
        lambda: approvals.list_pending(client),
        lambda reqs: all(r.workflow_id != handle.id for r in reqs),
    )


async def test_yes_to_10_alice_never_runs_9999_mallory(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 9999, "mallory-" + who)))
    req = await pending_of(client, handle)
    approved_hash = exactcall.intent_hash("transfer", bank.url, 10, who)
    res = await approvals.approve(client, handle.id, req.step, args_hash=approved_hash, by="ops")
    assert not res.accepted and res.outcome.startswith("hash mismatch")
    v = await approvals.view(client, handle.id)
    assert [p.step for p in v.pending] == [req.step]  # still pending
    assert v.decisions[-1].accepted is False and v.decisions[-1].decision.by == "ops"
    assert bank.count(to="mallory-" + who) == 0
    res = await approvals.deny(client, handle.id, req.step, args_hash=req.args_hash, reason="no")
    assert res.accepted
    out = await handle.result()
    assert out[0]["error"] == "ApprovalDenied" and "no" in out[0]["message"]
    assert bank.count(to="mallory-" + who) == 0


async def test_double_approve_and_racing_approvers_give_one_effect(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    results = await asyncio.gather(
        *(
            approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by=f"op{i}")
            for i in range(5)
        )
    )
    assert sum(r.accepted for r in results) == 1
    assert {r.outcome for r in results if not r.accepted} == {"already approved"}
    out = await handle.result()
    assert out[0]["ok"]["to"] == who
    assert bank.count(to=who) == 1


async def test_deny_after_approve_loses_the_first_decision_wins(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    h = client.get_workflow_handle(handle.id)
    ok = approvals.Decision(decision="approve", args_hash=req.args_hash, step=req.step, by="a")
    no = approvals.Decision(decision="deny", args_hash=req.args_hash, step=req.step, by="b")
    await h.signal(approvals.DECIDE_SIGNAL, ok)
    await h.signal(approvals.DECIDE_SIGNAL, no)
    out = await handle.result()
    assert out[0]["ok"]["to"] == who
    decisions = (await approvals.view(client, handle.id)).decisions
    assert [(d.decision.decision, d.accepted, d.outcome) for d in decisions] == [
        ("approve", True, "approved"),
        ("deny", False, "already approved"),
    ]
    assert bank.count(to=who) == 1


async def test_preapproval_is_consumed_once_by_the_exact_call_only(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    p = plan(
        step("transfer", bank.url, 10, "other-" + who),
        step("transfer", bank.url, 10, who),
        step("transfer", bank.url, 10, who),
        wait_first=True,
    )
    handle = await start_agent(client, tq, p)
    res = await approvals.preapprove(
        client, handle.id, "transfer", {"bank": bank.url, "amount": 10, "to": who}, by="ops"
    )
    # no exactcall call yet, so no approvals to check it against: Temporal holds the signal
    # until the first call, which checks it (it is never reported as accepted before that)
    assert (res.accepted, res.queued) == (False, True)
    assert res.outcome.startswith("sent; queued until the workflow's first exactcall call")
    await handle.signal("go")
    # the first call (other args) is not released by it
    first = await pending_of(client, handle)
    assert first.step == "transfer#1"
    await approvals.approve(client, handle.id, first.step, args_hash=first.args_hash)
    # transfer#2 consumed the pre-approval and ran; transfer#3 waits for its own approval
    third = await pending_of(client, handle)
    pre = [
        r for r in (await approvals.view(client, handle.id)).decisions if r.decision == res.decision
    ]
    assert [(r.accepted, r.outcome) for r in pre] == [
        (True, "pre-approval kept until the call is reached"),  # checked at the first call
        (True, "approved (pre-approval)"),
    ]
    assert third.step == "transfer#3"
    assert bank.count(to=who) == 1
    await approvals.deny(client, handle.id, third.step, args_hash=third.args_hash)
    out = await handle.result()
    assert [next(iter(o)) for o in out] == ["ok", "ok", "error"]
    assert bank.count(to=who) == 1


async def test_policy_and_expiry(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start_agent(
        client,
        tq,
        plan(step("refund", bank.url, 50, who), step("hasty_transfer", bank.url, 5, who)),
    )
    out = await handle.result()  # refund(50) needs no approval; hasty_transfer expires in 2 s
    assert out[0]["ok"]["amount"] == 50
    assert out[1]["error"] == "ApprovalExpired"
    assert bank.count(to=who) == 1
    handle = await start_agent(client, tq, plan(step("refund", bank.url, 500, who)))
    req = await pending_of(client, handle)
    assert req.tool == "refund"
    await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, reason="ok'd")
    out = await handle.result()
    assert out[0]["ok"]["amount"] == 500
    [rec] = (await approvals.view(client, handle.id)).decisions
    assert rec.decision.reason == "ok'd" and rec.decision.by  # the OS user by default


async def test_requester_may_not_approve_and_two_of_three(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await client.start_workflow(
        "Agent",
        plan(step("wire", bank.url, 77, who)),
        id=f"agent-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
        memo={approvals.REQUESTED_BY_MEMO: "carol"},
    )
    req = await pending_of(client, handle)
    assert req.requested_by == "carol" and req.approvals_needed == 2
    outcomes = []
    for by in ["carol", "mallory", "alice", "alice"]:
        r = await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by=by)
        outcomes.append((r.accepted, r.outcome))
    assert outcomes == [
        (False, "the requester may not approve their own call"),
        (False, "mallory is not an approver of wire"),
        (True, "approval 1 of 2 recorded"),
        (False, "alice already approved"),
    ]
    assert bank.count(to=who) == 0
    r = await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by="bob")
    assert (r.accepted, r.outcome) == (True, "approved")
    out = await handle.result()
    assert out[0]["ok"]["amount"] == 77
    assert bank.count(to=who) == 1


async def test_activity_refuses_an_intent_whose_approval_does_not_match(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    args = {"bank": bank.url, "amount": 9999, "to": who}
    for approved in (True, False):
        wid = f"forge-{uuid.uuid4().hex[:8]}"
        forged = _forged_intent(args, wid, tq, bank, who, approved)
        handle = await client.start_workflow(Forge.run, forged, id=wid, task_queue=tq)
        with pytest.raises(Exception) as err:
            await handle.result()
        assert "ApprovalMissing" in repr(err.value.__cause__.__cause__)  # type: ignore[union-attr]
    assert bank.count(to=who) == 0


def _forged_intent(
    args: dict[str, Any], wid: str, tq: str, bank: Bank, who: str, approved: bool
) -> exactcall.Intent:
    from datetime import UTC, datetime

    grant = approvals.ApprovalGrant(
        args_hash=exactcall.intent_hash("transfer", bank.url, 10, who),
        approved_by=("ops",),
        decided_at=datetime.now(UTC),
    )
    return exactcall.Intent(
        tool="transfer",
        tool_version="1",
        args=args,
        args_hash=exactcall.args_hash("transfer", args),
        namespace="default",
        workflow_id=wid,
        workflow_type="Forge",
        step="transfer#1",
        key=exactcall.derive_key("default", wid, "transfer#1", "transfer", "1"),
        record_task_queue=tq,
        approval=grant if approved else None,
    )


async def test_signed_decisions(server: DevServer, tq: str, bank: Bank, who: str) -> None:
    alice = Ed25519PrivateKey.generate()
    mallory = Ed25519PrivateKey.generate()
    plugin = exactcall.Plugin(approver_keys={"alice": alice.public_key()})
    client = await connect(Connection(address=server.address), plugin)
    async with running_worker(client, tq):
        handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
        req = await pending_of(client, handle)
        h = req.args_hash

        unsigned = await approvals.approve(client, handle.id, req.step, args_hash=h, by="alice")
        forged = await approvals.approve(
            client, handle.id, req.step, args_hash=h, by="alice", signing_key=mallory
        )
        # a valid signature by alice, but for another step: cannot be replayed onto this call
        other = approvals.Decision(
            decision="approve",
            args_hash=h,
            step="transfer#2",
            by="alice",
            expires_at=req.expires_at,
        )
        sig = alice.sign(approvals.signed_payload(handle.id, other))
        moved = other.model_copy(
            update={"step": req.step, "signature": base64.b64encode(sig).decode()}
        )
        await client.get_workflow_handle(handle.id).signal(approvals.DECIDE_SIGNAL, moved)
        good = await approvals.approve(
            client, handle.id, req.step, args_hash=h, by="alice", signing_key=alice
        )
        assert unsigned.outcome == "unsigned: this worker requires signed decisions"
        assert forged.outcome == "signature does not verify with alice's key"
        assert good.accepted, good.outcome
        records = (await approvals.view(client, handle.id)).decisions
        assert [r.accepted for r in records] == [False, False, False, True]
        out = await handle.result()
        assert out[0]["ok"]["to"] == who
    assert bank.count(to=who) == 1


async def test_with_signing_one_person_cannot_give_two_approvals_of_two_of_n(
    server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    keys = {name: Ed25519PrivateKey.generate() for name in ("alice", "bob", "carol")}
    with pytest.raises(ValueError, match="'alice' and 'bob' have the same public key"):
        exactcall.Plugin(
            approver_keys={"alice": keys["alice"].public_key(), "bob": keys["alice"].public_key()}
        )
    plugin = exactcall.Plugin(approver_keys={n: k.public_key() for n, k in keys.items()})
    client = await connect(Connection(address=server.address), plugin)
    async with running_worker(client, tq):
        handle = await start_agent(client, tq, plan(step("wire", bank.url, 10, who)))
        req = await pending_of(client, handle)
        h = req.args_hash
        first = await approvals.approve(
            client, handle.id, req.step, args_hash=h, by="alice", signing_key=keys["alice"]
        )
        # alice's own key, signing as bob: the second approval of the 2-of-3 is refused
        as_bob = await approvals.approve(
            client, handle.id, req.step, args_hash=h, by="bob", signing_key=keys["alice"]
        )
        # bob's real signature, but over another call's hash, moved onto this one
        other_hash = exactcall.intent_hash("wire", bank.url, 9999, "mallory")
        other = approvals.Decision(
            decision="approve",
            args_hash=other_hash,
            step=req.step,
            by="bob",
            expires_at=req.expires_at,
        )
        sig = keys["bob"].sign(approvals.signed_payload(handle.id, other))
        moved = other.model_copy(
            update={"args_hash": h, "signature": base64.b64encode(sig).decode()}
        )
        await client.get_workflow_handle(handle.id).signal(approvals.DECIDE_SIGNAL, moved)
        assert bank.count(to=who) == 0
        second = await approvals.approve(
            client, handle.id, req.step, args_hash=h, by="bob", signing_key=keys["bob"]
        )
        out = await handle.result()
        records = (await approvals.view(client, handle.id)).decisions
    assert first.accepted and first.outcome == "approval 1 of 2 recorded", first.outcome
    assert not as_bob.accepted and as_bob.outcome == "signature does not verify with bob's key"
    assert second.accepted and second.outcome == "approved", second.outcome
    assert [r.accepted for r in records] == [True, False, False, True]
    assert records[2].outcome == "signature does not verify with bob's key"
    assert out[0]["ok"]["to"] == who
    assert bank.count(to=who) == 1


async def test_a_worker_warns_when_approver_names_are_not_verified(
    worker_process: Callable[..., Any], tq: str
) -> None:
    wp = await worker_process(tq).started()
    await asyncio.sleep(0.5)  # the warning is logged right after the start line
    warned = [line for line in wp.log if "approvals.unsigned_identities" in line]
    assert len(warned) == 1, wp.tail  # wire: approvers=, min_approvals=2, not the requester
    assert "tool wire: approvers=, min_approvals=2, requester_may_approve=False" in warned[0]
    assert "approver_keys" in warned[0]
