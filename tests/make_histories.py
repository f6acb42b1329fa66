"""Regenerate the stored histories in tests/histories/ (run by hand after a deliberate change).

    python -m tests.make_histories              # every file
    python -m tests.make_histories NAME ...     # only these (e.g. reconciliation_marked)

Each file is the JSON of one real run on the embedded server; tests/test_replay.py replays them
against the current code, so a change that breaks replay of a running workflow fails CI. Files
recorded by an earlier protocol are worth keeping as they are: ``plain_call`` has the tool
activities' inputs as full intents (``plain_call_wire`` is the same run recorded with the
compact input of today, ``WireIntent``); ``call_record``,
``reconciliation`` and ``reconciliation_agent`` are of exactcall 0.x (a record that ran a
workflow task; verdicts by external signal), ``reconciliation_marked`` (and ``_agent``) of the
record protocol that closes records without a task (verdicts by the ``exactcall.mark_record``
local activity) with the reconciliation's patches asked where each is used;
``reconciliation_at_start`` (and ``_agent``) is the same run once the reconciliation decides
them in its first workflow task (``exactcall.reconcile-decides-at-start``). Regenerate only the
names a change is about.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from exactcall import approvals
from exactcall._model import intent_from_input
from exactcall._wire import undo_id
from exactcall._worker import Connection, build_worker, connect
from exactcall.activities import Record
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.reconciliation._verdicts import reconcile_id
from tests.cancel_app import HoldsTheJoin, SeesTheChildStart  # and its tools
from tests.conftest import plan, running_worker, step
from tests.workflows import Agent, Rounds, SagaAgent

HERE = Path(__file__).parent / "histories"
ONLY: set[str] = set()


async def _save(client: Client, workflow_id: str, name: str, run_id: str | None = None) -> None:
    if ONLY and name.rsplit("/", 1)[-1] not in ONLY:
        return
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    raw = without_stack_traces(history.to_json_dict())
    (HERE / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")


def without_stack_traces(value: Any) -> Any:
    """Failures' stack traces name this machine's paths; replay does not read them."""
    if isinstance(value, dict):
        return {k: "" if k == "stackTrace" else without_stack_traces(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_stack_traces(v) for v in value]
    return value


async def main() -> None:
    def wanted(*names: str) -> bool:
        return not ONLY or bool(ONLY & set(names))

    with DevServer() as srv, tempfile.TemporaryDirectory() as tmp, Bank(Path(tmp) / "b.db") as bank:
        client = await connect(Connection(address=srv.address))
        async with running_worker(client, "histories"):
            calls = plan(
                step("pay", bank.url, 10, "alice"),
                step("pay", bank.url, 10, "alice", key="second-payment"),
                step("balance", bank.url, "alice"),
                step("pay", bank.url, "ten", "alice"),
            )
            h = await client.start_workflow(
                Agent.run, calls, id="hist-plain", task_queue="histories"
            )
            await h.result()
            await _save(client, h.id, "plain_call")
            await _save(client, h.id, "plain_call_wire")  # (the same run, as recorded now)
            h2 = await client.start_workflow(
                Rounds.run, args=[bank.url, "bob", 3, []], id="hist-can", task_queue="histories"
            )
            await h2.result()
            await _save(client, h2.id, "continue_as_new_first", run_id=h2.run_id)
            await _save(client, h2.id, "continue_as_new_last")
            # approval: a call released by a decision bound to its args hash
            h3 = await client.start_workflow(
                Agent.run,
                plan(step("transfer", bank.url, 10, "alice")),
                id="hist-approval",
                task_queue="histories",
            )
            while not (await approvals.view(client, h3.id)).pending:
                await asyncio.sleep(0.1)
            req = await approvals.pending(client, h3.id)
            await approvals.approve(client, h3.id, req.step, args_hash=req.args_hash, by="ops")
            await h3.result()
            await _save(client, h3.id, "approval")
            # reconciliation: the answer is lost, the probe finds the payment
            h4 = await client.start_workflow(
                Agent.run,
                plan(step("book_then_explode", bank.url, 10, "carol")),
                id="hist-reconcile",
                task_queue="histories",
            )
            await h4.result()
            await _save(client, h4.id, "reconciliation_agent")
            async for wf in client.list_workflows("WorkflowType = 'exactcall.Reconcile'"):
                await _save(client, wf.id, "reconciliation")
            if wanted("cancel_while_joining_patched"):
                await _save_cancel_while_joining(client, bank)
            if wanted("cancel_before_join_sent_patched"):
                await _save_cancel_before_join_sent(client, bank)
            if wanted("reconciliation_marked", "reconciliation_marked_agent"):
                await _save_reconciliation(client, bank, "reconciliation_marked")
            if wanted("reconciliation_at_start", "reconciliation_at_start_agent"):
                await _save_reconciliation(client, bank, "reconciliation_at_start")
            # the probe says not landed, the call is re-run: reconciliation_rerun at once (the
            # old shape, keep it), reconciliation_outwaits once the earlier attempt's claim has
            # run out and the probe said it again (exactcall.reconcile-outwaits-the-claim)
            for name in ("reconciliation_rerun", "reconciliation_outwaits"):
                if wanted(name, f"{name}_agent"):
                    await _save_reconciliation(client, bank, name, tool="book_lost_once")
            for name in ("refused_before_recorded", "refused_recorded"):
                if wanted(name):
                    await _save_budget_refused(client, bank, name)
            if wanted("spends_carried", "ledger_batches"):
                await _save_budget_settled(client, bank, "spends_carried", "ledger_batches")
            if wanted("allowances", "ledger_allowances"):
                await _save_budget_ahead(client, bank)
            if wanted("cli_undo_keys_of_the_run"):
                await _save_cli_undo(client, bank)
            if wanted("proxy_owned_call", "proxy_owned_unknown"):
                await _save_mcp_owned(client, srv.address, Path(tmp))
            if wanted("proxy_approved_call"):
                await _save_mcp_approved(client, srv.address, Path(tmp))
            if wanted("session_call", "session_approved_call", "session_lock"):
                await _save_session(client, bank)
            # the per-key record of the first payment
            intent = await anext(_intents(client, h.id))
            rec = Record(client, intent)
            await _save(client, rec.id, "call_record")
        srv.stop()  # os._exit below skips the with block's exit, and would leave it running
    os._exit(0)


async def _save_reconciliation(
    client: Client, bank: Bank, name: str, tool: str = "book_then_explode"
) -> None:
    """A call whose answer is lost, the probe finds the payment; the verdict is written to the
    call's record (by the ``exactcall.mark_record`` local activity). With ``book_lost_once``
    the probe finds nothing and the reconciliation re-runs the call, which books it."""
    h = await client.start_workflow(
        Agent.run,
        plan(step(tool, bank.url, 10, "dave")),
        id=f"hist-{name}",
        task_queue="histories",
    )
    await h.result()
    await _save(client, h.id, f"{name}_agent")
    [intent] = [i async for i in _intents(client, h.id)]  # the agent's one call
    await _save(client, reconcile_id(intent.key), name)


async def _save_session(client: Client, bank: Bank) -> None:
    """An ``exactcall.session``'s workflows: a call (``session_call``), a call released by an
    approval (``session_approved_call``), and the session's lock (``session_lock``)."""
    import exactcall
    from exactcall._wire import session_call_id, session_id_prefix
    from tests.session_app import session_pay, session_pay_approved

    async with exactcall.session("hist-session", client=client) as s:
        await s.call(session_pay, bank.url, 10, "erin")
        step = "session_pay_approved#1"
        wid = session_call_id("hist-session", step)
        paying = asyncio.ensure_future(s.call(session_pay_approved, bank.url, 10, "erin"))
        while True:
            await asyncio.sleep(0.1)
            with contextlib.suppress(RPCError):  # (not started yet)
                if (await approvals.view(client, wid)).pending:
                    break
        req = await approvals.pending(client, wid)
        await approvals.approve(client, wid, step, args_hash=req.args_hash, by="ops")
        await paying
    await _save(client, session_call_id("hist-session", "session_pay#1"), "session/session_call")
    await _save(client, wid, "session/session_approved_call")
    lock = client.get_workflow_handle(session_id_prefix("hist-session"))
    await lock.result()
    await _save(client, lock.id, "session/session_lock")


async def _save_cancel_while_joining(client: Client, bank: Bank) -> None:
    """A call whose outcome is unknown joins the reconciliation its attempt started (no probe:
    parked for a person), and the workflow is cancelled while the join signal is in flight
    (``HoldsTheJoin`` makes that window): it ends cancelled and tells the reconciliation.
    ``cancel/cancel_while_joining.json`` is the same run recorded before the patch
    ``exactcall.cancelled-while-joining`` (the workflow then waited on forever); keep it."""
    hold = HoldsTheJoin()
    async with running_worker(client, "histories-hold", interceptors=[hold]):
        h = await client.start_workflow(
            Agent.run,
            plan(step("cancel_pay_then_fail", bank.url, 10, "joiner")),
            id="hist-cancel-while-joining",
            task_queue="histories-hold",
        )
        await asyncio.to_thread(hold.reached.wait, 30)
        await h.cancel()
        hold.go.set()
        with contextlib.suppress(WorkflowFailureError):
            await h.result()
        await _save(client, h.id, "cancel/cancel_while_joining_patched")


async def _save_cancel_before_join_sent(client: Client, bank: Bank) -> None:
    """The same call, cancelled in the workflow task that learns its reconciliation runs
    already (the worker is stopped after the child start is asked, so the start's failure
    and the cancellation land in one task): the join signal is cancelled before it is sent.
    ``cancel/cancel_before_join_sent.json`` is the same run recorded before the patch
    ``exactcall.join-cancelled-before-sent`` (the workflow then waited in an activity for a
    person's verdict); keep it."""
    sees = SeesTheChildStart()
    async with running_worker(client, "histories-child", interceptors=[sees]):
        h = await client.start_workflow(
            Agent.run,
            plan(step("cancel_pay_then_fail", bank.url, 10, "before-join")),
            id="hist-cancel-before-join-sent",
            task_queue="histories-child",
        )
        await asyncio.to_thread(sees.reached.wait, 30)
    for _ in range(200):
        events = [e.event_type async for e in h.fetch_history_events()]
        if EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED in events:
            break
        await asyncio.sleep(0.05)
    await h.cancel()
    async with running_worker(client, "histories-child"):
        with contextlib.suppress(WorkflowFailureError, TimeoutError):
            await asyncio.wait_for(h.result(), 10)
        await _save(client, h.id, "cancel/cancel_before_join_sent_patched")


async def _save_mcp_owned(client: Client, address: str, tmp: Path) -> None:
    """Write calls of ``exactcall mcp proxy`` sent by the proxy itself (ProxyOwnedCall): one
    answered and delivered, with a concurrent copy attached; one whose proxy was killed
    mid-write (unknown, then settled as landed by a person; a retry gets it)."""
    import signal

    from exactcall.cli._main import main as cli_main
    from exactcall.mcp._proxy_workflow import Outcome
    from tests.mcp_proxy_client import eventually, proxied

    async with proxied(tmp, name="hist-owned", address=address) as p:
        args = {"line": "h", "seconds": 0.3}
        await asyncio.gather(*(p.client.call_tool("slow_append", args) for _ in range(2)))
        await eventually(lambda: p.audit.exists() and p.audit_rows())
        wid = p.audit_rows()[-1]["workflow_id"]
        await client.get_workflow_handle(wid, result_type=Outcome).result()
        await _save(client, wid, "mcp/proxy_owned_call")
    effects, args = tmp / "killed.effects", {"line": "k", "seconds": 1.5}
    with contextlib.suppress(Exception):  # the client's session dies with the proxy
        async with proxied(tmp, name="hist-owned-k", address=address, effects=effects) as p:
            pending = asyncio.create_task(p.client.call_tool("slow_append", args))
            await eventually(Path(f"{effects}.started").exists)
            os.killpg(p.pids()[1], signal.SIGKILL)
            await asyncio.wait({pending}, timeout=10)
    async with proxied(tmp, name="hist-owned-k", address=address, effects=effects) as p2:
        again = await p2.client.call_tool("slow_append", args)
        meta = again.meta or {}
        wid, step = meta["io.exactcall/workflow-id"], meta["io.exactcall/step"]
        landed = ["resolve", wid, step, "--landed", "--result", '"landed"', "--yes"]
        assert await asyncio.to_thread(cli_main, [*landed, "--address", address]) == 0
        await p2.client.call_tool("slow_append", args)
        await client.get_workflow_handle(wid, result_type=Outcome).result()
        await _save(client, wid, "mcp/proxy_owned_unknown")


async def _save_mcp_approved(client: Client, address: str, tmp: Path) -> None:
    """A write of ``exactcall mcp proxy --approve append`` (ProxyCallApproved): the client
    waits, gets the tool error that says how to approve, a person approves, the same call
    sent again gets the result. ``proxy_approved_call`` was recorded before the patch
    ``exactcall.mcp.approval-seen`` (the first wait missed the approval request and held the
    client for its whole 30 s slice); keep it."""
    from exactcall.mcp._proxy_workflow import Outcome
    from tests.mcp_proxy_client import proxied

    flags = ("--approve", "append", "--approval-wait", "1s")
    async with proxied(tmp, *flags, name="hist-approved", address=address) as p:
        waiting = await p.client.call_tool("append", {"line": "a"})
        meta = waiting.meta or {}
        wid, step = meta["io.exactcall/workflow-id"], meta["io.exactcall/step"]
        req = await approvals.pending(client, wid, step)
        await approvals.approve(client, wid, step, args_hash=req.args_hash, by="ops")
        await p.client.call_tool("append", {"line": "a"})
        await client.get_workflow_handle(wid, result_type=Outcome).result()
        await _save(client, wid, "mcp/proxy_approved_call")


async def _save_budget_refused(client: Client, bank: Bank, name: str) -> None:
    """Three calls on a budget that refuses (limit 25): the third would pass it. Recorded as
    ``refused_before_recorded`` before ``exactcall.budget-refusals-recorded``, when a refusal
    left no trace in the run; ``refused_recorded`` once it is in the run's memo."""
    import tests.budget_app  # noqa: F401  (its tools)

    calls = plan(*[step("budget_strict", bank.url, 10, "erin") for _ in range(3)])
    async with build_worker(client, "histories-budget", [Agent]):
        h = await client.start_workflow(
            Agent.run, calls, id=f"hist-{name}", task_queue="histories-budget"
        )
        await h.result()
    await _save(client, h.id, f"budget/{name}")


async def _save_budget_settled(client: Client, bank: Bank, caller: str, ledger: str) -> None:
    """Three calls on the budget ``test-refunds``: two done, one that fails without running
    (released). ``budget/settled_at_once`` is the caller as recorded when every reservation
    was its own Update and every outcome settled at once (a local activity each);
    ``budget/ledger_updates`` is the ledger of that shape (one Update per reservation, one
    signal per settle, on its first caller's task queue): keep both as they are.
    ``budget/spends_carried`` and ``budget/ledger_batches`` are the same run since
    ``exactcall.budget-spends-carried`` (the first spend carried by the second reservation,
    the last sent when the run's code ended; the ledger takes batches)."""
    import tests.budget_app  # noqa: F401  (its tools)
    from exactcall._wire import budget_id

    calls = plan(
        step("budget_refund", bank.url, 10, "fay"),
        step("budget_refund", bank.url, 20, "fay"),
        step("budget_release_fail", bank.url, 5, "fay", fail=True),
    )
    async with build_worker(client, "histories-budget", [Agent]):
        h = await client.start_workflow(
            Agent.run, calls, id=f"hist-{caller}", task_queue="histories-budget"
        )
        await h.result()
    await _save(client, h.id, f"budget/{caller}")
    await _save(client, budget_id("test-refunds"), f"budget/{ledger}")


async def _save_budget_ahead(client: Client, bank: Bank) -> None:
    """Six sequential calls on ``test-ahead`` (the third fails without happening): the run's
    later calls draw from its allowance (``exactcall.budget-allowances``). Saved: the caller
    (``budget/allowances``) and the ledger (``budget/ledger_allowances``)."""
    import tests.budget_app  # noqa: F401  (its tools)
    from exactcall._wire import budget_id

    calls = plan(*[step("budget_ahead", bank.url, 5, "gus", fail=(i == 2)) for i in range(6)])
    async with build_worker(client, "histories-budget", [Agent]):
        h = await client.start_workflow(
            Agent.run, calls, id="hist-allowances", task_queue="histories-budget"
        )
        await h.result()
    await _save(client, h.id, "budget/allowances")
    await _save(client, budget_id("test-ahead"), "budget/ledger_allowances")


async def _save_cli_undo(client: Client, bank: Bank) -> None:
    """``exactcall undo`` of a finished saga's two calls (one with no undo declared), each
    undo a call of the saga's workflow id (``undo/cli_undo`` is the same run from before
    ``exactcall.undo-keys-of-the-run``: each undo a call of the undo workflow's own id)."""
    import tests.undo_app  # noqa: F401  (its tools)
    from exactcall.cli import _undo

    steps = [step("saga_pay", bank.url, 10, "dora"), step("saga_notify", bank.url, 5, "dora")]
    async with build_worker(client, "histories-undo", [SagaAgent]):
        h = await client.start_workflow(
            SagaAgent.run, {"steps": steps}, id="hist-undo-keys", task_queue="histories-undo"
        )
        await h.result()
        ns = argparse.Namespace(workflow_id=h.id, run=None, step=[], wait=60.0, yes=True, json=True)
        await _undo.run(ns, client)
    await _save(client, undo_id(h.id), "undo/cli_undo_keys_of_the_run")


async def _intents(client: Client, workflow_id: str) -> Any:
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            [value] = await client.data_converter.decode(a.input.payloads)
            yield intent_from_input(value, workflow_type="Agent", task_queue=a.task_queue.name)


if __name__ == "__main__":
    ONLY.update(sys.argv[1:])
    asyncio.run(main())
