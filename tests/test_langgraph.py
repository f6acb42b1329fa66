"""exactcall.langgraph: LangGraph agents on temporalio-langgraph whose tool calls happen once.

Real parts: the dev server, the real LangGraph and temporalio-langgraph packages with a
scripted fake chat model, worker processes killed with SIGKILL, and the local bank, which
counts the payments.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.langgraph import LangGraphPlugin
from temporalio.worker import Worker

import exactcall
import exactcall.langgraph as xlg
from exactcall import approvals
from exactcall._worker import build_worker
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.quickstart import langgraph as quickstart
from exactcall.quickstart._common import CRASH_PLAIN_ENV
from exactcall.testing import WorkerProcess, assert_replays
from tests import lg_app
from tests.lg_app import HISTORIES, LgAgent, pay_call
from tests.test_runs import reset_to_first_task

ROOT = Path(__file__).resolve().parent.parent
APP = ["tests.lg_app"]


@pytest.fixture
async def lg_worker(client: Client, tq: str) -> AsyncIterator[Worker]:
    async with build_worker(client, tq, [LgAgent], plugins=lg_app.plugins()) as w:
        yield w


async def start(
    client: Client, tq: str, script: list[list[dict[str, Any]]], **kw: Any
) -> WorkflowHandle[Any, Any]:
    req = {"script": script, **({"graph": kw.pop("graph")} if "graph" in kw else {})}
    wid = kw.pop("wid", None) or f"lg-{uuid.uuid4().hex[:10]}"
    return await client.start_workflow(LgAgent.run, req, id=wid, task_queue=tq, **kw)


async def eventually(probe: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    """Poll ``probe`` until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError("timed out waiting")


async def interrupt_value(handle: WorkflowHandle[Any, Any], query: Any = LgAgent.waiting) -> Any:
    """The value of the graph's pending interrupt, once there is one."""

    async def waiting() -> Any:
        values = await handle.query(query)
        return values[0] if values else None

    return await eventually(waiting)


async def scheduled(handle: WorkflowHandle[Any, Any], activity: str) -> int:
    n = 0
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            n += ev.activity_task_scheduled_event_attributes.activity_type.name == activity
    return n


# -- the happy path ------------------------------------------------------------------------
async def test_each_tool_call_runs_once_with_its_step_and_key(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    script = [[pay_call("lg_pay", bank.url, 10, who)], [pay_call("lg_pay", bank.url, 20, who)]]
    handle = await start(client, tq, script)
    out = await handle.result()
    assert bank.count(to=who) == 2
    steps = [t["exactcall"]["step"] for t in out["tools"]]
    assert steps == ["lg_pay#1", "lg_pay#2"]
    for t, row in zip(out["tools"], bank.store.payments(to=who), strict=True):
        assert t["status"] == "success"
        key = exactcall.derive_key("default", handle.id, t["exactcall"]["step"], "lg_pay", "1")
        assert t["exactcall"]["key"] == key == row["idempotency_key"]
        assert t["exactcall"]["args_hash"] == exactcall.intent_hash(
            lg_app.lg_pay, bank=bank.url, amount=row["amount"], to=who
        )
    assert out["answer"].startswith("done. lg_pay:success:")  # the model ran after the tools
    assert await scheduled(handle, "lg_agent.model") == 3


async def test_arguments_that_do_not_fit_the_tool_are_a_tool_error(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(client, tq, [[pay_call("lg_pay", bank.url, "ten", who)]])
    out = await handle.result()
    assert bank.count(to=who) == 0
    [t] = out["tools"]
    assert t["status"] == "error"
    assert t["content"].startswith("lg_pay error (InvalidCall): lg_pay() argument 'amount'")
    assert out["answer"].startswith("done. lg_pay:error:")


def test_langchain_tools_carry_the_signature_without_the_key() -> None:
    [t] = xlg.tools(lg_app.lg_pay)
    schema = t.tool_call_schema.model_json_schema()
    assert t.name == "lg_pay"
    assert t.description == "Pay `amount` to the account `to` at the bank."
    assert sorted(schema["properties"]) == ["amount", "bank", "to"]
    with pytest.raises(exactcall.UnknownTool, match=r"no @exactcall\.tool"):
        xlg.tools("lg_no_such_tool")
    with pytest.raises(TypeError, match="not tools of this node"):
        xlg.tool_node(lg_app.lg_pay, interrupt_on=[lg_app.lg_gated_pay])


def test_the_core_does_not_import_langgraph_and_the_extra_is_named_when_missing() -> None:
    probe = (
        "import sys\n"
        "import exactcall, exactcall.cli._main, exactcall.testing, exactcall.approvals\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "leaked = sorted(top & {'langgraph', 'langchain_core'})\n"
        "assert not leaked, leaked\n"
        "sys.modules['langgraph'] = None\n"
        "import exactcall.langgraph\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1
    assert "ImportError: exactcall.langgraph needs LangGraph" in run.stderr
    assert "pip install 'exactcall[langgraph]'" in run.stderr


# -- crashes, reruns, resets ---------------------------------------------------------------
@pytest.mark.crash
async def test_worker_killed_right_after_the_payment_pays_once(
    client: Client, server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    def worker(crash_at: str | None = None) -> WorkerProcess:
        return WorkerProcess(
            server.address, tq, tools=APP, workflows=APP, plugins=["tests.lg_app:plugins"],
            crash_at=crash_at, cwd=ROOT,
        )  # fmt: skip

    workers = [worker("lg_pay:after_call:1")]  # a WorkerProcess starts when it is made
    try:
        await workers[0].started()
        handle = await start(client, tq, [[pay_call("lg_pay", bank.url, 10, who)]])
        assert await workers[0].killed() == -9
        workers.append(worker())
        await workers[1].started()
        out = await handle.result()
    finally:
        for wp in workers:
            wp.stop()
    [row] = bank.store.payments(to=who)
    assert bank.count(to=who) == 1
    assert out["tools"][0]["status"] == "success"  # the probe found the payment: its row
    assert f'"id": {row["id"]}' in out["tools"][0]["content"]
    assert row["idempotency_key"] == out["tools"][0]["exactcall"]["key"]
    assert out["answer"].startswith("done. lg_pay:success:")


async def test_a_reset_reruns_the_model_and_pays_nothing_more(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(client, tq, [[pay_call("lg_pay", bank.url, 10, who)]])
    first = await handle.result()
    new_run = await reset_to_first_task(client, handle)
    again = await client.get_workflow_handle(handle.id, run_id=new_run).result()
    assert bank.count(to=who) == 1
    # the model ran again and gave the call a new id; it still got step lg_pay#1
    assert again["tools"][0]["tool_call_id"] != first["tools"][0]["tool_call_id"]
    assert again["tools"][0]["exactcall"] == first["tools"][0]["exactcall"]
    assert again["tools"][0]["content"] == first["tools"][0]["content"]


async def test_other_arguments_under_a_step_that_ran_are_a_conflict_the_agent_sees(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"lg-conflict-{uuid.uuid4().hex[:8]}"
    h1 = await start(client, tq, [[pay_call("lg_pay", bank.url, 10, who)]], wid=wid)
    await h1.result()
    h2 = await start(client, tq, [[pay_call("lg_pay", bank.url, 99, who)]], wid=wid)
    out = await h2.result()  # a new run under the same workflow id: step lg_pay#1 again
    assert bank.count(to=who) == 1
    [t] = out["tools"]
    assert t["status"] == "error"
    assert t["content"].startswith("lg_pay error (IntentConflict):")
    assert "Nothing was executed" in t["content"]
    assert out["answer"].startswith("done. lg_pay:error:")


async def test_a_key_function_makes_repeated_calls_one_effect(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the same payment twice in one turn, again in the next, then the same payee for 99
    same = pay_call("lg_pay_once", bank.url, 10, who)
    other = pay_call("lg_pay_once", bank.url, 99, who)
    handle = await start(client, tq, [[same, same], [same], [other]], graph="lg_keyed")
    out = await handle.result()
    assert [p["amount"] for p in bank.store.payments(to=who)] == [10]
    first, twin, again, conflict = out["tools"]
    assert [t["status"] for t in out["tools"]] == ["success"] * 3 + ["error"]
    assert first["content"] == twin["content"] == again["content"]  # one payment's receipt
    assert conflict["content"].startswith("lg_pay_once error (IntentConflict):")
    key = exactcall.derive_key("default", handle.id, f"pay-to-{who}", "lg_pay_once", "1")
    assert {t["exactcall"]["key"] for t in out["tools"]} == {key}
    assert {t["exactcall"]["step"] for t in out["tools"]} == {f"pay-to-{who}"}


def test_a_bad_key_option_is_refused_when_the_node_is_built() -> None:
    with pytest.raises(TypeError, match=r"tool_node\(key=3\): give a function"):
        xlg.tool_node(lg_app.lg_pay, key=3)  # type: ignore[arg-type]


async def test_a_node_rerun_on_resume_does_not_pay_again(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # pay_then_confirm pays, then interrupts; LangGraph re-runs the whole node on resume
    script = [[pay_call("lg_pay", bank.url, 10, who), pay_call("lg_pay", bank.url, 20, who)]]
    handle = await start(client, tq, script, graph="lg_confirm")
    asked = await interrupt_value(handle)
    assert len(asked["confirm"]) == 2 and bank.count(to=who) == 2
    assert await handle.query(LgAgent.approvals) == []  # not an approval request
    await handle.signal(LgAgent.resume, {"ok": True})
    out = await handle.result()
    assert bank.count(to=who) == 2
    assert [t["content"] for t in out["tools"]] == asked["confirm"]  # the same receipts
    assert await scheduled(handle, "lg_pay") == 2


# -- approvals -----------------------------------------------------------------------------
async def test_exactcall_approval_waits_and_runs_once_on_the_right_hash(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(client, tq, [[pay_call("lg_approved_pay", bank.url, 10, who)]])

    async def listed() -> Any:
        return [p for p in await approvals.list_pending(client) if p.workflow_id == handle.id]

    [req] = await eventually(listed)
    assert (req.tool, req.step) == ("lg_approved_pay", "lg_approved_pay#1")
    assert req.args == {"bank": bank.url, "amount": 10, "to": who}
    wrong = exactcall.intent_hash(lg_app.lg_approved_pay, bank=bank.url, amount=9999, to=who)
    res = await approvals.approve(client, handle.id, req.step, args_hash=wrong, by="t")
    assert not res.accepted and "hash mismatch" in res.outcome
    assert bank.count(to=who) == 0
    res = await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by="t")
    assert res.accepted
    out = await handle.result()
    assert bank.count(to=who) == 1
    assert out["tools"][0]["status"] == "success"
    assert out["tools"][0]["exactcall"]["args_hash"] == req.args_hash


async def test_a_denied_exactcall_approval_is_a_tool_error(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(client, tq, [[pay_call("lg_approved_pay", bank.url, 10, who)]])
    req = await eventually(lambda: _pending(client, handle.id))
    await approvals.deny(client, handle.id, req.step, args_hash=req.args_hash, reason="no")
    out = await handle.result()
    assert bank.count(to=who) == 0
    [t] = out["tools"]
    assert t["status"] == "error"
    assert t["content"] == "lg_approved_pay error (ApprovalDenied): lg_approved_pay " + (
        "lg_approved_pay#1 was denied: no"
    )
    assert out["answer"].startswith("done. lg_approved_pay:error:")


async def _pending(client: Client, wid: str) -> Any:
    try:
        return await approvals.pending(client, wid)
    except LookupError:
        return None


async def test_interrupt_approval_runs_only_on_the_hash_of_the_call(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    script = [
        [pay_call("lg_gated_pay", bank.url, 10, who), pay_call("lg_gated_pay", bank.url, 20, who)],
        [pay_call("lg_gated_pay", bank.url, 30, who)],
        [pay_call("lg_gated_pay", bank.url, 40, who)],
    ]
    handle = await start(client, tq, script)
    # one turn, two calls: one interrupt each, both before either call runs
    for n, amount in ((1, 10), (2, 20)):
        asked = await interrupt_value(handle, LgAgent.approvals)
        assert await handle.query(LgAgent.waiting) == [asked]
        h = exactcall.intent_hash(lg_app.lg_gated_pay, bank=bank.url, amount=amount, to=who)
        assert asked["type"] == xlg.APPROVAL_INTERRUPT
        assert (asked["tool"], asked["step"], asked["args_hash"]) == (
            "lg_gated_pay", f"lg_gated_pay#{n}", h,
        )  # fmt: skip
        assert asked["args"] == {"bank": bank.url, "amount": amount, "to": who}
        assert asked["key"] == exactcall.derive_key(
            "default", handle.id, asked["step"], "lg_gated_pay", "1"
        )
        assert bank.count(to=who) == 0
        await handle.signal(LgAgent.resume, xlg.approve(asked["args_hash"], by="t").resume)
    # a resume carrying another call's hash runs nothing
    asked = await interrupt_value(handle, LgAgent.approvals)
    other = exactcall.intent_hash(lg_app.lg_gated_pay, bank=bank.url, amount=9999, to=who)
    await handle.signal(LgAgent.resume, xlg.approve(other).resume)
    # a refusal runs nothing
    asked = await interrupt_value(handle, LgAgent.approvals)
    await handle.signal(LgAgent.resume, xlg.deny("too much", by="t").resume)
    out = await handle.result()
    assert sorted(p["amount"] for p in bank.store.payments(to=who)) == [10, 20]
    statuses = [(t["status"], t["content"][:60]) for t in out["tools"]]
    assert [s for s, _ in statuses] == ["success", "success", "error", "error"]
    assert "hash mismatch" in out["tools"][2]["content"]
    assert "lg_gated_pay lg_gated_pay#4 was denied by t: too much" in out["tools"][3]["content"]
    assert out["answer"].startswith("done. lg_gated_pay:success:")


async def test_a_gated_call_the_model_gave_no_id_does_not_run(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(
        client, tq, [[{**pay_call("lg_gated_pay", bank.url, 10, who), "id": None}]]
    )
    out = await handle.result()  # no interrupt could be matched to it: refused, not asked
    assert bank.count(to=who) == 0
    [t] = out["tools"]
    assert t["status"] == "error"
    assert "needs approval (interrupt_on), but the model's tool call has no id" in t["content"]


async def test_interrupt_approvals_are_listed_and_answered_by_exactcall_approvals(
    client: Client, lg_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    yes, no = f"{who}-yes", f"{who}-no"
    turn = [pay_call("lg_gated_pay", bank.url, 10, yes), pay_call("lg_gated_pay", bank.url, 20, no)]
    handle = await client.start_workflow(
        LgAgent.run,
        {"script": [turn], "decide": True},
        id=f"lg-decided-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
    )

    async def pending_for(to: str) -> Any:
        reqs = (await approvals.view(client, handle.id)).pending
        return next((r for r in reqs if r.args["to"] == to), None)

    # LangGraph raises a node's interrupts one at a time: the first call's, then the next one
    first = await eventually(lambda: pending_for(yes))
    assert first.step.startswith("lg_gated_pay@")
    h = exactcall.intent_hash(lg_app.lg_gated_pay, bank=bank.url, amount=10, to=yes)
    assert first.args_hash == h
    other = exactcall.intent_hash(lg_app.lg_gated_pay, bank=bank.url, amount=20, to=no)
    wrong = await approvals.approve(client, handle.id, first.step, args_hash=other, by="ops")
    assert not wrong.accepted
    await approvals.approve(client, handle.id, first.step, args_hash=h, by="ops")
    second = await eventually(lambda: pending_for(no))
    assert second.args_hash == other and bank.count(to=yes) == 0  # the turn runs after both
    await approvals.deny(client, handle.id, second.step, args_hash=other, reason="not today")
    out = await handle.result()
    assert bank.count(to=yes) == 1 and bank.count(to=no) == 0
    by_to = {t["exactcall"]["args_hash"]: t for t in out["tools"]}
    assert by_to[h]["status"] == "success"
    denied = by_to[other]
    assert denied["status"] == "error" and "not today" in denied["content"]


def test_resume_values_are_built_by_approve_and_deny() -> None:
    assert xlg.approve("ab12", by="ops").resume == {
        "approve": True,
        "args_hash": "ab12",
        "by": "ops",
    }
    assert xlg.deny("no").resume == {"approve": False, "reason": "no"}
    with pytest.raises(TypeError, match="args_hash"):
        xlg.approve("")


# -- plugin composition, replay -------------------------------------------------------------
@pytest.mark.parametrize("exactcall_first", [True, False], ids=["exactcall-first", "lg-first"])
async def test_composes_with_langgraph_plugin_in_either_order(
    server: DevServer, tq: str, bank: Bank, who: str, exactcall_first: bool
) -> None:
    ours: list[Any] = [exactcall.Plugin()]
    theirs: list[Any] = lg_app.plugins()
    assert isinstance(theirs[0], LangGraphPlugin)
    c = await Client.connect(
        server.address, plugins=ours + theirs if exactcall_first else theirs + ours
    )
    async with Worker(c, task_queue=tq, workflows=[LgAgent]):
        handle = await start(c, tq, [[pay_call("lg_pay", bank.url, 10, who)]])
        out = await handle.result()
    assert bank.count(to=who) == 1
    assert out["tools"][0]["status"] == "success"
    assert await scheduled(handle, "lg_agent.model") == 2  # the model turn after the tool too


async def test_stored_agent_history_replays() -> None:
    await assert_replays(
        HISTORIES, workflows=[LgAgent], plugins=[*lg_app.plugins(), exactcall.Plugin(tools=[])]
    )


# -- the quickstart ------------------------------------------------------------------------
@pytest.mark.crash
async def test_quickstart_plain_pays_twice_exactcall_once(
    client: Client, server: DevServer, tq: str, bank: Bank
) -> None:
    mod = "exactcall.quickstart.langgraph"
    plain, ours = f"acct-{uuid.uuid4().hex[:8]}", f"acct-{uuid.uuid4().hex[:8]}"
    workers: list[WorkerProcess] = []

    async def new_worker() -> WorkerProcess:
        wp = WorkerProcess(
            server.address, tq, tools=[mod], workflows=[mod], plugins=[f"{mod}:plugins"],
            crash_at=f"{quickstart.EXACTCALL_TOOL}:after_call:1", env={CRASH_PLAIN_ENV: "1"},
            cwd=ROOT,
        )  # fmt: skip
        workers.append(wp)
        return await wp.started()

    try:
        answers = [
            await _finish(new_worker, workers, client, agent, [bank.url, account], tq)
            for agent, account in (
                (quickstart.PlainAgent, plain),
                (quickstart.ExactcallAgent, ours),
            )
        ]
    finally:
        for wp in workers:
            wp.stop()
    assert len(workers) == 3  # one kill right after each agent's payment
    assert bank.count(to=plain) == 2
    assert bank.count(to=ours) == 1
    assert answers[1].startswith(f"Paid 10 to {ours} (payment ")
    assert answers[0].startswith(f"Paid 10 to {plain} (payment ")
    assert (quickstart.FRAMEWORK, quickstart.EXTRA) == ("LangGraph", "langgraph")


async def _finish(
    new_worker: Callable[[], Awaitable[WorkerProcess]],
    workers: list[WorkerProcess],
    client: Client,
    agent: Any,
    args: list[Any],
    tq: str,
) -> str:
    """Run one agent to its end, starting a new worker whenever the last one was killed."""
    if not workers or workers[-1].proc.poll() is not None:
        await new_worker()
    handle = await client.start_workflow(agent.run, args=args, id=f"lg-qs-{args[1]}", task_queue=tq)
    result = asyncio.ensure_future(handle.result())
    deadline = asyncio.get_running_loop().time() + 60
    while not result.done():
        if asyncio.get_running_loop().time() > deadline:
            result.cancel()
            raise AssertionError(f"{handle.id} did not finish: {workers[-1].tail}")
        await asyncio.wait([result], timeout=0.5)
        if not result.done() and workers[-1].proc.poll() is not None:
            await new_worker()  # the last one was killed right after the payment
    return result.result()
