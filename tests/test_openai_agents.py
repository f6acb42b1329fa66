"""exactcall.openai_agents: OpenAI Agents SDK agents on Temporal, their tool calls once.

Real dev server, real worker processes killed with SIGKILL, the real local bank counting the
payments, the real SDK and its Temporal plugin with a scripted model (tests/oa_app.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agents import FunctionTool
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.openai_agents import OpenAIPayloadConverter
from temporalio.worker import Worker

import exactcall
from exactcall import approvals, reconciliation
from exactcall import openai_agents as oa
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._replay import load_history, recorded_intents
from exactcall.quickstart import openai_agents as quickstart
from exactcall.testing import WorkerProcess, assert_replays
from tests import oa_app
from tests.oa_app import OaAgent, OaDecided, OaNativeHitl, script
from tests.test_runs import reset_to_first_task

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


# -- fixtures and helpers ------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def oa_client(server: DevServer) -> Client:
    """A client with exactcall.Plugin() and then OpenAIAgentsPlugin (the scripted model)."""
    return await connect(Connection(address=server.address), others=oa_app.plugins())


@pytest.fixture
async def oa_worker(oa_client: Client, tq: str) -> AsyncIterator[Worker]:
    async with build_worker(oa_client, tq, [OaAgent, OaNativeHitl, OaDecided]) as w:
        yield w


@pytest.fixture
def processes() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def make(server: DevServer, tq: str, app: str, crash_at: str | None = None, **kw: Any):
        wp = WorkerProcess(
            server.address,
            tq,
            tools=[app],
            workflows=[app],
            plugins=[f"{app}:plugins"],
            crash_at=crash_at,
            cwd=ROOT,
            **kw,
        )
        started.append(wp)
        return wp

    yield make
    for wp in started:
        wp.stop()


async def eventually(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float = 15
) -> T:
    deadline = asyncio.get_running_loop().time() + timeout
    value: Any = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            value = await fn()
            if ok(value):
                return value
        except Exception as exc:  # e.g. a query before the first workflow task
            value = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout}s: last value {value!r}")


def pay(bank: Bank, to: str, amount: int = 10, tool: str = "oa_pay") -> tuple[str, dict[str, Any]]:
    return tool, {"bank": bank.url, "amount": amount, "to": to}


async def start(client: Client, tq: str, plan: dict[str, Any], wf: Any = OaAgent.run, **kw: Any):
    wid = kw.pop("id", None) or f"oa-{uuid.uuid4().hex[:10]}"
    return await client.start_workflow(wf, plan, id=wid, task_queue=tq, **kw)


async def intents(client: Client, handle: WorkflowHandle[Any, Any]) -> list[exactcall.Intent]:
    return await recorded_intents(await handle.fetch_history(), client.data_converter)


def outputs(result: dict[str, Any]) -> list[Any]:
    """The tool outputs the model saw, parsed when they are JSON."""
    out = []
    for o in result["outputs"]:
        try:
            out.append(json.loads(o))
        except json.JSONDecodeError:
            out.append(o)
    return out


# -- the tool itself ----------------------------------------------------------------------------
def test_function_tool_schema_comes_from_the_signature_without_the_key() -> None:
    ft = oa.function_tool(quickstart.oa_quickstart_pay)
    assert isinstance(ft, FunctionTool)
    assert ft.name == "oa_quickstart_pay"
    assert ft.description.startswith("Pay ``amount`` to account ``to``")
    assert set(ft.params_json_schema["properties"]) == {"bank", "amount", "to"}
    assert ft.params_json_schema["properties"]["amount"]["type"] == "integer"
    assert ft.params_json_schema["additionalProperties"] is False
    loose = oa.function_tool(oa_app.oa_pay, name="pay_loose", strict_json_schema=False)
    assert loose.name == "pay_loose" and "additionalProperties" not in loose.params_json_schema


def test_bad_tool_names_and_non_tools_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"not a valid OpenAI tool name.*name=\.\.\."):
        oa.function_tool(oa_app.oa_pay, name="pay money")
    with pytest.raises(exactcall.UnknownTool, match=r"decorate the function with @exactcall\.tool"):
        oa.function_tool(print)


# -- happy path, parallel calls, crash, reset -----------------------------------------------------
async def test_one_effect_step_and_key_as_expected_and_the_agent_continues(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who)], final="thanks"))
    result = await handle.result()
    [receipt] = outputs(result)
    assert result["final"] == "thanks"  # the second model turn ran after the tool
    assert bank.count(to=who) == 1
    [intent] = await intents(oa_client, handle)
    assert (intent.tool, intent.step) == ("oa_pay", "oa_pay#1")
    assert intent.key == exactcall.derive_key("default", handle.id, "oa_pay#1", "oa_pay", "1")
    assert intent.args_hash == exactcall.intent_hash(oa_app.oa_pay, bank.url, 10, who)
    assert receipt["idempotency_key"] == intent.key and receipt["to"] == who


async def test_parallel_calls_of_one_turn_get_ordinal_steps_in_the_models_order(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    first, second, third = (f"{who}-{n}" for n in ("a", "b", "c"))
    plan = script([pay(bank, first), pay(bank, second)], [pay(bank, third)])
    handle = await start(oa_client, tq, plan)
    result = await handle.result()
    steps = {i.args["to"]: i.step for i in await intents(oa_client, handle)}
    assert steps == {first: "oa_pay#1", second: "oa_pay#2", third: "oa_pay#3"}
    assert [o["to"] for o in outputs(result)] == [first, second, third]
    assert [bank.count(to=a) for a in (first, second, third)] == [1, 1, 1]


@pytest.mark.crash
async def test_worker_killed_right_after_the_payment_pays_once(
    oa_client: Client,
    server: DevServer,
    processes: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    a = await processes(server, tq, "tests.oa_app", crash_at="oa_pay:after_call:1").started()
    handle = await start(oa_client, tq, script([pay(bank, who)], final="after the crash"))
    assert await a.killed() == -9
    assert bank.count(to=who) == 1  # the payment happened, its result was never recorded
    await processes(server, tq, "tests.oa_app").started()
    result = await handle.result()
    [receipt] = outputs(result)
    assert result["final"] == "after the crash"
    assert receipt["probe"] is True and receipt["to"] == who  # settled by asking the bank
    assert bank.count(to=who) == 1


async def test_a_reset_rerun_model_with_new_call_ids_does_not_pay_again(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who)]))
    first = await handle.result()
    new_run = await reset_to_first_task(oa_client, handle)
    again = await oa_client.get_workflow_handle(handle.id, run_id=new_run).result()
    assert outputs(again) == outputs(first)  # the recorded receipt, under the same key
    assert bank.count(to=who) == 1


# -- refusals the agent sees as tool errors -------------------------------------------------------
async def test_an_unknown_outcome_fails_the_run_and_never_reaches_the_model(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the one rule of exactcall.adapters: a model told "it failed" would call again (a new
    # step, a new key) and may pay twice, so the run fails and the reconciliation goes on
    handle = await start(oa_client, tq, oa_app.script([pay(bank, who, tool="oa_pay_then_lose")]))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "AmbiguousOutcome" in str(failed.value.cause) or (
        getattr(failed.value.cause, "type", None) == "AmbiguousOutcome"
    )
    assert bank.count(to=who) == 1

    async def listed() -> list[str]:  # visibility: eventually consistent
        rows = await reconciliation.list_unresolved(oa_client)
        return [r.step for r in rows if r.workflow_id == handle.id]

    assert await eventually(listed, lambda steps: steps == ["oa_pay_then_lose#1"]) == [
        "oa_pay_then_lose#1"
    ]


async def test_other_arguments_under_a_step_that_ran_are_a_conflict_the_agent_sees(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    wid = f"oa-conflict-{uuid.uuid4().hex[:8]}"
    h1 = await start(oa_client, tq, script([pay(bank, who, 10)]), id=wid)
    await h1.result()
    # a new run under the same workflow id: the model now wants to pay 99 at the same step
    h2 = await start(oa_client, tq, script([pay(bank, who, 99)], final="noted"), id=wid)
    result = await h2.result()
    [err] = outputs(result)
    assert err["error"] == "IntentConflict" and err["step"] == "oa_pay#1"
    assert "Nothing was executed" in err["message"]
    assert result["final"] == "noted"  # the run went on
    assert [p["amount"] for p in bank.payments() if p["to_account"] == who] == [10]


async def test_a_key_function_makes_a_repeated_call_one_effect(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    again = pay(bank, who, 10, tool="oa_pay_once")
    other = pay(bank, who, 99, tool="oa_pay_once")
    plan = script([again], [again], [other], [pay(bank, who, 5, tool="oa_pay_badkey")])
    handle = await start(oa_client, tq, plan)
    first, repeat, conflict, badkey = outputs(await handle.result())
    assert repeat == first  # the first call's result: the payment made once
    assert conflict["error"] == "IntentConflict" and conflict["step"] == f"pay-to-{who}"
    assert badkey["error"] == "InvalidCall" and "key function returned 5" in badkey["message"]
    assert [p["amount"] for p in bank.payments() if p["to_account"] == who] == [10]
    [intent] = await intents(oa_client, handle)
    assert intent.step == f"pay-to-{who}"
    assert intent.key == exactcall.derive_key("default", handle.id, intent.step, "oa_pay", "1")


def test_a_bad_key_option_is_refused_when_the_tool_is_built() -> None:
    with pytest.raises(TypeError, match=r"function_tool\(key='to'\): give a function"):
        oa.function_tool(oa_app.oa_pay, key="to")  # type: ignore[arg-type]


async def test_invalid_arguments_from_the_model_are_a_tool_error(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    bad = ("oa_pay", {"bank": bank.url, "amount": "ten", "to": who})
    result = await (await start(oa_client, tq, script([bad], [pay(bank, who)]))).result()
    err, receipt = outputs(result)
    assert err["error"] == "InvalidCall" and "'amount'" in err["message"]
    assert receipt["to"] == who
    assert bank.count(to=who) == 1


async def test_a_denied_exactcall_approval_is_a_tool_error(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who, tool="oa_approved_pay")]))
    v = await eventually(lambda: approvals.view(oa_client, handle.id), lambda v: bool(v.pending))
    [req] = v.pending
    await approvals.deny(oa_client, handle.id, req.step, args_hash=req.args_hash, by="ops")
    result = await handle.result()
    [err] = outputs(result)
    assert err["error"] == "ApprovalDenied" and err["step"] == "oa_approved_pay#1"
    assert result["final"] == "done"
    assert bank.count(to=who) == 0


# -- exactcall's approval: the run waits, listed, bound to the hash -------------------------------
async def test_exactcall_approval_waits_is_listed_and_runs_once_with_its_hash(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who, 25, tool="oa_approved_pay")]))
    listed = await eventually(
        lambda: approvals.list_pending(oa_client),
        lambda reqs: any(r.workflow_id == handle.id for r in reqs),
    )
    [req] = [r for r in listed if r.workflow_id == handle.id]
    assert (req.step, req.tool) == ("oa_approved_pay#1", "oa_approved_pay")
    assert req.args == {"bank": bank.url, "amount": 25, "to": who}
    assert req.args_hash == exactcall.intent_hash(oa_app.oa_approved_pay, bank.url, 25, who)
    wrong = exactcall.intent_hash(oa_app.oa_approved_pay, bank.url, 9999, "mallory")
    refused = await approvals.approve(oa_client, handle.id, req.step, args_hash=wrong, by="ops")
    assert not refused.accepted and "mismatch" in refused.outcome
    assert bank.count(to=who) == 0
    ok = await approvals.approve(oa_client, handle.id, req.step, args_hash=req.args_hash, by="ops")
    assert ok.accepted
    [receipt] = outputs(await handle.result())
    assert receipt["amount"] == 25 and receipt["to"] == who
    assert bank.count(to=who) == 1


# -- the SDK's own human-in-the-loop, bound to the hash -------------------------------------------
async def interruptions(client: Client, handle: WorkflowHandle[Any, Any], n: int = 1) -> Any:
    return await eventually(
        lambda: handle.query(OaNativeHitl.interruptions),
        lambda v: len(v["pending"]) == n,
    )


async def test_native_approval_with_the_hash_runs_once_and_a_wrong_hash_runs_nothing(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    now = f"{who}-now"
    plan = script([pay(bank, now, 5, tool="oa_pay_now"), pay(bank, who, 50)])
    handle = await start(oa_client, tq, plan, wf=OaNativeHitl.run)
    [item] = (await interruptions(oa_client, handle))["pending"]
    assert item["tool"] == "oa_pay"
    assert item["args_hash"] == exactcall.intent_hash(oa_app.oa_pay, bank.url, 50, who)
    assert bank.count(to=now) == 1 and bank.count(to=who) == 0  # the ungated call already ran
    wrong = exactcall.intent_hash(oa_app.oa_pay, bank.url, 5000, who)
    await handle.signal(
        OaNativeHitl.decide, {"call_id": item["call_id"], "args_hash": wrong, "decision": "approve"}
    )
    seen = await eventually(
        lambda: handle.query(OaNativeHitl.interruptions), lambda v: bool(v["rejected"])
    )
    assert "stays pending" in seen["rejected"][0] and seen["pending"] == [item]
    assert bank.count(to=who) == 0
    decision = {"call_id": item["call_id"], "args_hash": item["args_hash"], "decision": "approve"}
    await handle.signal(OaNativeHitl.decide, decision)
    result = await handle.result()
    assert [o["to"] for o in outputs(result)] == [now, who]
    steps = {i.args["to"]: i.step for i in await intents(oa_client, handle)}
    assert steps == {now: "oa_pay#1", who: "oa_pay#2"}  # the resume did not re-run oa_pay_now
    assert bank.count(to=now) == 1 and bank.count(to=who) == 1


async def test_a_native_approval_policy_gates_only_the_calls_it_names(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    small, big = f"{who}-small", f"{who}-big"
    plan = script([pay(bank, small, 5, tool="oa_pay_big"), pay(bank, big, 500, tool="oa_pay_big")])
    handle = await start(oa_client, tq, plan, wf=OaNativeHitl.run)
    [item] = (await interruptions(oa_client, handle))["pending"]
    assert json.loads(item["arguments"])["amount"] == 500
    assert bank.count(to=small) == 1 and bank.count(to=big) == 0
    decision = {"call_id": item["call_id"], "args_hash": item["args_hash"], "decision": "approve"}
    await handle.signal(OaNativeHitl.decide, decision)
    assert [o["to"] for o in outputs(await handle.result())] == [small, big]
    assert bank.count(to=small) == 1 and bank.count(to=big) == 1


async def test_native_approval_without_the_hash_is_refused_at_the_tool(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who)]), wf=OaNativeHitl.run)
    [item] = (await interruptions(oa_client, handle))["pending"]
    await handle.signal(
        OaNativeHitl.decide, {"call_id": item["call_id"], "decision": "sdk_approve"}
    )
    result = await handle.result()
    [err] = outputs(result)
    assert err["error"] == "ApprovalMissing"
    assert "exactcall.openai_agents.approve" in err["message"]
    assert result["final"] == "done"
    assert bank.count(to=who) == 0


async def test_native_rejection_is_what_the_agent_sees(
    oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(oa_client, tq, script([pay(bank, who)]), wf=OaNativeHitl.run)
    [item] = (await interruptions(oa_client, handle))["pending"]
    await handle.signal(OaNativeHitl.decide, {"call_id": item["call_id"], "decision": "deny"})
    assert outputs(await handle.result()) == ["a person denied this payment"]
    assert bank.count(to=who) == 0


async def test_native_approvals_are_listed_and_answered_by_exactcall_approvals(
    server: DevServer, oa_client: Client, oa_worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # two calls need a person (needs_approval=True): both listed at once, one approved with
    # its hash, one denied; a wrong hash is refused and leaves the call pending
    yes, no = f"{who}-yes", f"{who}-no"
    handle = await start(
        oa_client, tq, script([pay(bank, yes), pay(bank, no)], final="ok"), wf=OaDecided.run
    )

    async def both() -> list[Any]:
        return (await approvals.view(oa_client, handle.id)).pending

    reqs = {r.args["to"]: r for r in await eventually(both, lambda rs: len(rs) == 2)}
    assert reqs[yes].step.startswith("oa_pay@") and reqs[yes].tool == "oa_pay"
    assert reqs[yes].args_hash == exactcall.intent_hash(oa_app.oa_pay, bank.url, 10, yes)

    async def listed_by_the_cli() -> list[dict[str, Any]]:  # visibility: eventually
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exactcall", "approvals", "list", "--json",
            "--address", server.address, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        return [r for r in json.loads(out) if r["workflow_id"] == handle.id]

    rows = await eventually(listed_by_the_cli, lambda rows: len(rows) == 2)
    assert {r["step"] for r in rows} == {reqs[yes].step, reqs[no].step}
    wrong = await approvals.approve(
        oa_client, handle.id, reqs[yes].step, args_hash=reqs[no].args_hash, by="ops"
    )
    assert not wrong.accepted and bank.count(to=yes) == 0
    ok = await approvals.approve(
        oa_client, handle.id, reqs[yes].step, args_hash=reqs[yes].args_hash, by="ops"
    )
    assert ok.accepted
    await approvals.deny(
        oa_client, handle.id, reqs[no].step, args_hash=reqs[no].args_hash, reason="not today"
    )
    result = await handle.result()
    paid, refused = outputs(result)
    assert paid["to"] == yes and bank.count(to=yes) == 1
    assert "ApprovalDenied" in str(refused) and "not today" in str(refused)
    assert bank.count(to=no) == 0


async def test_approve_outside_a_workflow_is_refused_clearly() -> None:
    with pytest.raises(exactcall.ExactcallError, match="runs in the workflow that resumes"):
        oa.approve(None, None, args_hash="0" * 64)  # type: ignore[arg-type]


# -- plugin composition, both orders --------------------------------------------------------------
@pytest.mark.parametrize("exactcall_first", [True, False], ids=["exactcall-first", "openai-first"])
async def test_plugins_compose_in_either_order_with_a_real_agent_run(
    server: DevServer, tq: str, bank: Bank, who: str, exactcall_first: bool
) -> None:
    pair = [exactcall.Plugin(), oa_app.openai_plugin()]
    client = await Client.connect(server.address, plugins=pair if exactcall_first else pair[::-1])
    async with Worker(client, task_queue=tq, workflows=[OaAgent]):
        result = await (await start(client, tq, script([pay(bank, who)], final="two"))).result()
    assert result["final"] == "two"  # the model activity after the tool decoded its input
    assert [o["to"] for o in outputs(result)] == [who]
    assert bank.count(to=who) == 1


# -- replay of the stored history -----------------------------------------------------------------
async def test_the_stored_agent_history_replays_with_its_intents() -> None:
    plugins = [oa_app.openai_plugin(), exactcall.Plugin(tools=[])]  # the SDK's converter first
    [path] = sorted(oa_app.HISTORIES.glob("*.json"))
    conv = DataConverter(payload_converter_class=OpenAIPayloadConverter)
    recorded = await recorded_intents(load_history(path), conv)
    assert [i.step for i in recorded] == ["oa_pay#1", "oa_pay#2", "oa_pay#3"]  # not model inputs
    await assert_replays(oa_app.HISTORIES, workflows=[OaAgent], plugins=plugins)


# -- the quickstart scenario ----------------------------------------------------------------------
@pytest.mark.crash
async def test_quickstart_plain_pays_twice_exactcall_once(
    oa_client: Client,
    server: DevServer,
    processes: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    app = "exactcall.quickstart.openai_agents"
    env = {"EXACTCALL_QUICKSTART_CRASH_PLAIN": "1"}
    crash = f"{quickstart.EXACTCALL_TOOL}:after_call:1"
    first = await processes(server, tq, app, crash_at=crash, env=env).started()
    plain_to, exact_to = f"{who}-plain", f"{who}-exactcall"
    plain = await oa_client.start_workflow(
        quickstart.PlainAgent.run, args=[bank.url, plain_to], id=f"qs-{who}-p", task_queue=tq
    )
    exact = await oa_client.start_workflow(
        quickstart.ExactcallAgent.run, args=[bank.url, exact_to], id=f"qs-{who}-x", task_queue=tq
    )
    assert await first.killed() == -9
    both = asyncio.ensure_future(asyncio.gather(plain.result(), exact.result()))
    while not both.done():  # restart until both agents finish, as `exactcall quickstart` does
        wp = await processes(server, tq, app, crash_at=crash, env=env).started()
        killed = asyncio.ensure_future(wp.killed())
        await asyncio.wait([both, killed], return_when=asyncio.FIRST_COMPLETED)
        killed.cancel()
    plain_text, exact_text = both.result()
    assert bank.count(to=plain_to) == 2  # the plain activity was retried and paid again
    assert bank.count(to=exact_to) == 1
    [row] = [p for p in bank.payments() if p["to_account"] == exact_to]
    assert exact_text == f"Paid. The bank's receipt: payment {row['id']}"
    assert plain_text.startswith("Paid. The bank's receipt: payment ")
