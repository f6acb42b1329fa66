"""A tool that gains a parameter with a default keeps the identity of its calls across a deploy
(issue 21 item 4): the same recorded result, approval and key; other changes are drift.

The app before the deploy (tests/sig_v1.py) runs in one worker process, the app after it
(tests/sig_v2.py: ``currency: str = "EUR"`` added) in another; this process imports only the
new one, as a deployed fleet would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

import exactcall
from exactcall import approvals
from exactcall.demo.bank import Bank
from exactcall.evidence._replay import replay_histories
from exactcall.testing import WorkerProcess
from tests import sig_v2
from tests.conftest import ROOT
from tests.sig_workflow import SigRefund

V1 = {"tools": ["tests.sig_v1"], "workflows": ["tests.sig_workflow"], "cwd": ROOT}
V2 = {"tools": ["tests.sig_v2"], "workflows": ["tests.sig_workflow"], "cwd": ROOT}
Start = Callable[..., Awaitable[WorkerProcess]]


def old_hash(tool: str, **args: Any) -> str:
    """The args hash the app before the deploy recorded (its signature had no currency)."""
    return exactcall.args_hash(tool, args)


async def refund(client: Client, tq: str, wid: str, approved: bool = False, **args: Any) -> Any:
    return await client.start_workflow(
        "SigRefund", {"args": args, "approved": approved}, id=wid, task_queue=tq
    )


# -- the rule ------------------------------------------------------------------------------------
def test_only_a_parameter_added_at_its_default_keeps_the_identity() -> None:
    t = sig_v2.sig_refund
    now = t.canonical_args((), {"bank": "b", "order": "o1", "amount": 10})
    assert now["currency"] == "EUR"  # defaults are part of the canonical args
    before = old_hash("sig_refund", bank="b", order="o1", amount=10)
    assert before != t.hash("b", "o1", 10)
    assert t.same_call(before, now)  # added with a default the call leaves at it
    usd = t.canonical_args((), {"bank": "b", "order": "o1", "amount": 10, "currency": "USD"})
    assert not t.same_call(before, usd)  # the call sets the new parameter: another call
    assert not t.same_call(old_hash("sig_refund", bank="b", order="o1", amount=11), now)
    # a default that changed under a parameter the call had is another call
    eur_then = old_hash("sig_refund", bank="b", order="o1", amount=10, currency="GBP")
    assert not t.same_call(eur_then, now)
    # a parameter removed (the old call had it) is another call
    removed = old_hash("sig_refund", bank="b", order="o1", amount=10, currency="EUR", memo="")
    assert not t.same_call(removed, now)
    assert not t.same_call(None, now) and not t.same_call(["x"], now)  # type: ignore[arg-type]


def test_recorded_arguments_that_no_longer_bind_are_refused_before_the_tool_runs() -> None:
    t = sig_v2.sig_refund
    # recorded before the deploy: no currency, which the new code fills with its default
    pos, kw = t.arguments_for_call({"bank": "b", "order": "o1", "amount": 10})
    assert (pos, kw) == ([], {"bank": "b", "order": "o1", "amount": 10})
    with pytest.raises(exactcall.ArgumentsNoLongerFit, match=r"no 'amount', which the tool now"):
        t.arguments_for_call({"bank": "b", "order": "o1"})  # a required parameter added
    with pytest.raises(exactcall.ArgumentsNoLongerFit, match=r"recorded amount='ten' no longer"):
        t.arguments_for_call({"bank": "b", "order": "o1", "amount": "ten"})
    assert issubclass(exactcall.ArgumentsNoLongerFit, exactcall.NotExecuted)


# -- across a deploy -----------------------------------------------------------------------------
@pytest.mark.crash
async def test_a_rerun_after_the_deploy_gets_the_recorded_result_and_pays_nothing(
    crash_at: Start, client: Client, exactcall_task_queue: str, bank: Bank, tmp_path: Path
) -> None:
    tq = exactcall_task_queue
    order, wid = f"order-{uuid.uuid4().hex[:8]}", f"sig-{uuid.uuid4().hex[:8]}"
    old = await crash_at(**V1)
    h1 = await refund(client, tq, wid, bank=bank.url, order=order, amount=10)
    first = await h1.result()
    old.stop()
    await crash_at(**V2)
    # a re-run of the id (a reset would do the same): the same call, by the new code
    again = await (await refund(client, tq, wid, bank=bank.url, order=order, amount=10)).result()
    assert again == first and bank.count(to=order) == 1
    usd = {"bank": bank.url, "order": order, "amount": 10, "currency": "USD"}
    other = await (await refund(client, tq, wid, **usd)).result()
    assert other["error"] == "IntentConflict" and bank.count(to=order) == 1
    # the history of the first run replays on the new code: no drift, a note that says why
    history = await client.get_workflow_handle(wid, run_id=h1.result_run_id).fetch_history()
    path = tmp_path / "before_the_deploy.json"
    path.write_text(json.dumps(history.to_json_dict()))
    [report] = await replay_histories([path], [SigRefund])
    assert report.ok, report.problems
    [note] = report.notes
    assert 'gained currency="EUR"' in note and "same call" in note


@pytest.mark.crash
async def test_an_attempt_in_flight_across_the_deploy_is_not_refused(
    crash_at: Start, client: Client, exactcall_task_queue: str, bank: Bank
) -> None:
    order, wid = f"order-{uuid.uuid4().hex[:8]}", f"sig-{uuid.uuid4().hex[:8]}"
    old = await crash_at("sig_refund", "after_call", **V1)  # killed right after the refund
    handle = await refund(client, exactcall_task_queue, wid, bank=bank.url, order=order, amount=7)
    assert await old.killed() == -9
    await crash_at(**V2)  # the next attempt carries the old intent, on the new code
    result = await handle.result()
    assert result["amount"] == 7 and bank.count(to=order) == 1  # the key made the re-send safe


@pytest.mark.crash
async def test_an_approval_given_for_the_old_hash_still_runs_the_call_once(
    crash_at: Start, client: Client, exactcall_task_queue: str, bank: Bank
) -> None:
    order, wid = f"order-{uuid.uuid4().hex[:8]}", f"sig-{uuid.uuid4().hex[:8]}"
    old = await crash_at(**V1)
    args = {"bank": bank.url, "order": order, "amount": 5}
    handle = await refund(client, exactcall_task_queue, wid, approved=True, **args)
    req = await _pending(client, wid)
    seen = old_hash("sig_approved_refund", **args)
    assert req.args_hash == seen  # what the person reviewed, before the deploy
    old.stop()
    await crash_at(**V2)
    # after the deploy the workflow lists the call with its new hash, and takes either
    assert (await _pending(client, wid)).args_hash == sig_v2.sig_approved_refund.hash(**args)
    res = await approvals.approve(client, wid, req.step, args_hash=seen, by="ops")
    assert res.accepted, res.record
    result = await handle.result()
    assert result["amount"] == 5 and bank.count(to=order) == 1
    # and another call's hash is still refused: the binding did not loosen
    wid2 = f"sig-{uuid.uuid4().hex[:8]}"
    h2 = await refund(client, exactcall_task_queue, wid2, approved=True, **{**args, "amount": 6})
    req2 = await _pending(client, wid2)
    res2 = await approvals.approve(client, wid2, req2.step, args_hash=seen, by="ops")
    assert not res2.accepted and "hash mismatch" in (res2.record.outcome if res2.record else "")
    # deny it, so nothing is left pending in the namespace (other tests list pending calls)
    await approvals.deny(client, wid2, req2.step, args_hash=req2.args_hash, reason="test over")
    assert (await h2.result())["error"] == "ApprovalDenied"
    assert bank.count(to=order) == 1


@pytest.mark.parametrize("name", ["refund_before_currency", "approved_before_currency"])
async def test_stored_histories_of_the_old_signature_replay_on_the_new(name: str) -> None:
    # recorded by tests/sig_v1.py's worker (no currency); the approved one holds a decision for
    # the old hash, which the new code must accept again on replay (else: nondeterminism)
    path = ROOT / "tests" / "histories" / "sig" / f"{name}.json"
    [report] = await replay_histories([path], [SigRefund])
    assert report.ok, report.problems
    assert report.calls == 1 and 'gained currency="EUR"' in report.notes[0]


async def _pending(client: Client, wid: str) -> Any:
    import asyncio

    for _ in range(200):
        try:
            return await approvals.pending(client, wid)
        except LookupError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"{wid}: no pending approval")
