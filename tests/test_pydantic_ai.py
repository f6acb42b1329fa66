"""exactcall.pydantic_ai: a real Pydantic AI agent (scripted FunctionModel) on a real dev server.

Effects are counted at the real local HTTP bank; crashes are real worker processes SIGKILLed
right after the payment.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolResults, ModelResponse, TextPart, ToolApproved
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

import exactcall
from exactcall import approvals, reconciliation
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.pydantic_ai import ARGS_HASH, approve, toolset
from exactcall.quickstart import pydantic_ai as quickstart
from exactcall.testing import WorkerProcess, assert_replays
from tests.conftest import ROOT
from tests.pai_app import (
    HISTORIES,
    PaiAgent,
    PaiDecided,
    PaiKeyedAgent,
    PaiLosingAgent,
    pai_approved_pay,
    pai_hitl_pay,
    pai_pay,
    prompt,
)
from tests.test_runs import reset_to_first_task

APP = ["tests.pai_app"]
APP_PLUGINS = ["tests.pai_app:plugins"]


# -- fixtures and helpers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
async def pai_client(server: DevServer) -> Client:
    """exactcall's plugin, then Pydantic AI's (the order `exactcall worker --plugin` uses)."""
    return await connect(Connection(address=server.address), others=[PydanticAIPlugin()])


@pytest.fixture
async def pai_worker(pai_client: Client, tq: str) -> AsyncIterator[None]:
    async with build_worker(pai_client, tq, [PaiAgent]):
        yield


async def test_an_unknown_outcome_fails_the_run_and_never_reaches_the_model(
    pai_client: Client, tq: str, bank: Bank, who: str
) -> None:
    # the one rule of exactcall.adapters: a model told "it failed" would call again (a new
    # step, a new key) and may pay twice, so the run fails and the reconciliation goes on
    async with build_worker(pai_client, tq, [PaiLosingAgent]):
        handle = await pai_client.start_workflow(
            PaiLosingAgent.run,
            prompt(bank.url, ("pai_pay_then_lose", 3, who)),
            id=f"pai-lose-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
    cause = failed.value.cause
    assert getattr(cause, "type", None) == "AmbiguousOutcome", repr(cause)
    assert bank.count(to=who) == 1

    async def listed() -> list[str]:  # visibility: eventually consistent
        rows = await reconciliation.list_unresolved(pai_client)
        return [r.tool for r in rows if r.workflow_id == handle.id]

    assert await eventually(listed) == ["pai_pay_then_lose"]


async def start(client: Client, tq: str, text: str, wid: str | None = None) -> WorkflowHandle:
    wid = wid or f"pai-{uuid.uuid4().hex[:10]}"
    return await client.start_workflow(PaiAgent.run, text, id=wid, task_queue=tq)


async def eventually(fn: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    """Poll ``fn`` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = await fn()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"nothing after {timeout}s")


async def activity_types(handle: WorkflowHandle) -> list[str]:
    out = []
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out.append(ev.activity_task_scheduled_event_attributes.activity_type.name)
    return out


def without_ids(text: str) -> str:
    """The agent's answer without the tool call ids (a re-run model turn draws new ones)."""
    return re.sub(r" \[call [^\]]+\]$", "", text, flags=re.MULTILINE)


def call_ids(text: str) -> list[str]:
    return re.findall(r" \[call ([^\]]+)\]$", text, flags=re.MULTILINE)


def paid(bank: Bank, who: str) -> list[tuple[int, str]]:
    return [(p["amount"], p["to_account"]) for p in bank.payments() if p["to_account"] == who]


# -- the tool the model sees -------------------------------------------------------------------
async def test_the_model_sees_the_tool_signature_without_the_key_and_its_docstring() -> None:
    seen: list[Any] = []

    def look(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("nothing to do")])

    agent = Agent(FunctionModel(look), toolsets=[toolset(pai_pay, pai_hitl_pay)])
    assert (await agent.run("hello")).output == "nothing to do"
    [pay_def] = [d for d in seen if d.name == "pai_pay"]
    assert pay_def.description == pai_pay.__doc__
    schema = pay_def.parameters_json_schema
    assert set(schema["properties"]) == {"bank", "amount", "to"}
    assert schema["properties"]["amount"]["type"] == "integer"
    assert sorted(schema["required"]) == ["amount", "bank", "to"]
    assert sorted(d.name for d in seen) == ["pai_hitl_pay", "pai_pay"]


# -- happy path, crash, conflict ---------------------------------------------------------------
async def test_one_payment_step_and_key_derived_agent_continues(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(pai_client, tq, prompt(bank.url, ("pai_pay", 10, who)))
    text = await handle.result()
    key = exactcall.derive_key("default", handle.id, "pai_pay#1", "pai_pay", "1")
    [row] = bank.payments(idempotency_key=key)
    assert (row["amount"], row["to_account"]) == (10, who)
    assert text.startswith("pai_pay ok:") and key in text  # the model read the receipt
    kinds = await activity_types(handle)
    assert kinds == [
        "agent__pai_agent__model_request",
        "pai_pay",
        "agent__pai_agent__model_request",
    ]  # the call is exactcall's tool activity, never a Pydantic AI toolset activity


async def test_killed_right_after_the_payment_pays_once(
    crash_at: Callable[..., Awaitable[WorkerProcess]],
    client: Client,
    exactcall_task_queue: str,
    bank: Bank,
    who: str,
) -> None:
    kw: dict[str, Any] = {"tools": APP, "workflows": APP, "plugins": APP_PLUGINS, "cwd": ROOT}
    a = await crash_at("pai_pay", "after_call", **kw)
    handle = await client.start_workflow(
        "PaiAgent",
        prompt(bank.url, ("pai_pay", 10, who)),
        id=f"pai-crash-{uuid.uuid4().hex[:8]}",
        task_queue=exactcall_task_queue,
        result_type=str,
    )
    assert await a.killed() == -9
    assert paid(bank, who) == [(10, who)]
    await crash_at(**kw)  # a healthy worker: the probe finds the payment
    text = await handle.result()
    assert paid(bank, who) == [(10, who)]
    key = exactcall.derive_key("default", handle.id, "pai_pay#1", "pai_pay", "1")
    assert text.startswith("pai_pay ok:") and key in text  # the bank's row, found by the probe


async def test_a_reset_reruns_the_model_and_pays_nothing_more(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(pai_client, tq, prompt(bank.url, ("pai_pay", 10, who)))
    first = await handle.result()
    new_run = await reset_to_first_task(pai_client, handle)
    again = await pai_client.get_workflow_handle(handle.id, run_id=new_run).result()
    assert call_ids(again) != call_ids(first)  # the model ran again: a new tool call id
    assert without_ids(again) == without_ids(first)  # still step pai_pay#1: the same receipt
    assert paid(bank, who) == [(10, who)]


async def test_a_new_run_reuses_the_result_and_other_args_conflict(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    wid = f"pai-rerun-{uuid.uuid4().hex[:8]}"

    async def run(amount: int) -> str:
        handle = await start(pai_client, tq, prompt(bank.url, ("pai_pay", amount, who)), wid)
        return await handle.result()

    first = await run(10)
    again = await run(10)
    # a new run id and new tool call ids, the same step and key: the recorded receipt
    assert call_ids(again) != call_ids(first)
    assert without_ids(again) == without_ids(first)
    other = await run(99)
    assert other.startswith("pai_pay failed:") and "IntentConflict" in other
    assert "Nothing was executed" in other  # the agent saw it as a tool error and finished
    assert paid(bank, who) == [(10, who)]


async def test_a_key_function_makes_repeated_calls_one_effect(
    pai_client: Client, tq: str, bank: Bank, who: str
) -> None:
    # one model turn: the same payment twice (in parallel), then the same payee for 99
    calls = [("pai_pay_once", 10, who), ("pai_pay_once", 10, who), ("pai_pay_once", 99, who)]
    async with build_worker(pai_client, tq, [PaiKeyedAgent]):
        handle = await pai_client.start_workflow(
            PaiKeyedAgent.run,
            prompt(bank.url, *calls),
            id=f"pai-keyed-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        first, repeat, other = without_ids(await handle.result()).splitlines()
    assert first.startswith("pai_pay_once ok:") and repeat == first
    assert other.startswith("pai_pay_once failed:") and "IntentConflict" in other
    assert paid(bank, who) == [(10, who)]
    key = exactcall.derive_key("default", handle.id, f"pay-to-{who}", "pai_pay_once", "1")
    assert [p["amount"] for p in bank.payments(idempotency_key=key)] == [10]


# -- exactcall's own approval ------------------------------------------------------------------
async def test_exactcall_approval_waits_is_listed_and_runs_once_with_its_hash(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(pai_client, tq, prompt(bank.url, ("pai_approved_pay", 10, who)))

    async def mine() -> list[approvals.ApprovalRequest]:
        return [r for r in await approvals.list_pending(pai_client) if r.workflow_id == handle.id]

    [req] = await eventually(mine)
    assert (req.step, req.tool) == ("pai_approved_pay#1", "pai_approved_pay")
    assert req.args_hash == exactcall.intent_hash(pai_approved_pay, bank.url, 10, who)
    wrong = exactcall.intent_hash(pai_approved_pay, bank.url, 9999, "mallory")
    res = await approvals.approve(pai_client, handle.id, req.step, args_hash=wrong, by="ops")
    assert not res.accepted and res.outcome.startswith("hash mismatch")
    assert paid(bank, who) == []
    res = await approvals.approve(
        pai_client, handle.id, req.step, args_hash=req.args_hash, by="ops"
    )
    assert res.accepted
    text = await handle.result()
    assert text.startswith("pai_approved_pay ok:")
    assert paid(bank, who) == [(10, who)]


async def test_a_denied_approval_is_a_tool_error_the_agent_reads(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle = await start(pai_client, tq, prompt(bank.url, ("pai_approved_pay", 10, who)))
    req = await eventually(lambda: _pending_exactcall(pai_client, handle.id))
    await approvals.deny(
        pai_client, handle.id, req.step, args_hash=req.args_hash, by="ops", reason="not today"
    )
    text = await handle.result()
    assert text.startswith("pai_approved_pay failed:") and "ApprovalDenied" in text
    assert "not today" in text
    assert paid(bank, who) == []


async def _pending_exactcall(client: Client, wid: str) -> approvals.ApprovalRequest | None:
    return next(iter((await approvals.view(client, wid)).pending), None)


# -- Pydantic AI's deferred approvals, bound to the hash ---------------------------------------
async def hitl_run(client: Client, tq: str, bank: Bank, who: str) -> tuple[WorkflowHandle, Any]:
    """pai_pay (runs) and pai_hitl_pay (deferred) in one model turn; the pending requests."""
    text = prompt(bank.url, ("pai_pay", 10, who), ("pai_hitl_pay", 20, who))
    handle = await start(client, tq, text)
    requests = await eventually(lambda: handle.query(PaiAgent.pending_tool_calls))
    return handle, requests


async def test_deferred_approval_with_the_hash_runs_once_and_the_resume_repeats_nothing(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle, requests = await hitl_run(pai_client, tq, bank, who)
    [call] = requests.approvals
    h = requests.metadata[call.tool_call_id][ARGS_HASH]
    assert h == exactcall.intent_hash(pai_hitl_pay, bank.url, 20, who)
    assert requests.metadata[call.tool_call_id]["exactcall_args"] == call.args_as_dict()
    assert paid(bank, who) == [(10, who)]  # pai_pay ran; the deferred call did not
    with pytest.raises(ValueError, match="is not the hash of the requested call"):
        approve(requests, call.tool_call_id, args_hash=exactcall.intent_hash(pai_pay, "x", 1, "y"))
    await handle.signal(PaiAgent.decide, approve(requests, call.tool_call_id, args_hash=h))
    text = await handle.result()
    assert text.splitlines()[1].startswith("pai_hitl_pay ok:")
    assert paid(bank, who) == [(10, who), (20, who)]  # resumed: pai_pay was not paid again


async def test_deferred_approvals_are_listed_and_answered_by_exactcall_approvals(
    pai_client: Client, tq: str, bank: Bank, who: str
) -> None:
    yes, no = f"{who}-yes", f"{who}-no"
    text = prompt(bank.url, ("pai_hitl_pay", 10, yes), ("pai_hitl_pay", 20, no))
    async with build_worker(pai_client, tq, [PaiDecided]):
        handle = await pai_client.start_workflow(
            PaiDecided.run, text, id=f"pai-decided-{uuid.uuid4().hex[:8]}", task_queue=tq
        )

        async def both() -> list[Any] | None:
            pending = (await approvals.view(pai_client, handle.id)).pending
            return pending if len(pending) == 2 else None

        reqs = {r.args["to"]: r for r in await eventually(both)}
        assert reqs[yes].step.startswith("pai_hitl_pay@")
        assert reqs[yes].args_hash == exactcall.intent_hash(pai_hitl_pay, bank.url, 10, yes)
        wrong = await approvals.approve(
            pai_client, handle.id, reqs[yes].step, args_hash=reqs[no].args_hash, by="ops"
        )
        assert not wrong.accepted
        await approvals.approve(
            pai_client, handle.id, reqs[yes].step, args_hash=reqs[yes].args_hash, by="ops"
        )
        await approvals.deny(
            pai_client, handle.id, reqs[no].step, args_hash=reqs[no].args_hash, reason="no"
        )
        answer = without_ids(await handle.result())
    assert paid(bank, yes) == [(10, yes)] and paid(bank, no) == []
    ok, denied = answer.splitlines()
    assert ok.startswith("pai_hitl_pay ok:")
    assert "ApprovalDenied" in denied, denied


@pytest.mark.parametrize("how", ["plain True", "forged hash", "override, stale hash"])
async def test_deferred_approval_not_bound_to_the_args_releases_nothing(
    how: str, pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle, requests = await hitl_run(pai_client, tq, bank, who)
    [call] = requests.approvals
    h = requests.metadata[call.tool_call_id][ARGS_HASH]
    if how == "plain True":
        results = DeferredToolResults(approvals={call.tool_call_id: True})
        expected = "a plain True releases nothing"
    elif how == "forged hash":  # built by hand, past approve()'s own check
        other = exactcall.intent_hash(pai_hitl_pay, bank.url, 9999, who)
        results = DeferredToolResults(
            approvals={call.tool_call_id: ToolApproved()},
            metadata={call.tool_call_id: {ARGS_HASH: other}},
        )
        expected = f"is for args hash {other}"
    else:
        mallory = {"bank": bank.url, "amount": 9999, "to": who}
        results = approve(requests, call.tool_call_id, args_hash=h, override_args=mallory)
        expected = "override_args change the hash"
    await handle.signal(PaiAgent.decide, results)
    text = await handle.result()
    refusal = text.splitlines()[1]
    assert refusal.startswith("pai_hitl_pay failed: ") and "ApprovalMissing" in refusal
    assert expected in refusal and "Nothing ran" in refusal
    if how == "plain True":
        assert "exactcall.pydantic_ai.approve(" in refusal
    assert paid(bank, who) == [(10, who)]


async def test_override_args_run_when_approved_with_their_own_hash(
    pai_client: Client, pai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    handle, requests = await hitl_run(pai_client, tq, bank, who)
    [call] = requests.approvals
    changed = {"bank": bank.url, "amount": 15, "to": who}
    h = exactcall.intent_hash(pai_hitl_pay, **changed)
    await handle.signal(
        PaiAgent.decide, approve(requests, call.tool_call_id, args_hash=h, override_args=changed)
    )
    assert "pai_hitl_pay ok:" in await handle.result()
    assert paid(bank, who) == [(10, who), (15, who)]


# -- plugin composition, replay ----------------------------------------------------------------
@pytest.mark.parametrize("exactcall_first", [True, False], ids=["exactcall-first", "pai-first"])
async def test_plugins_compose_in_either_order(
    exactcall_first: bool, server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    ours, theirs = exactcall.Plugin(), PydanticAIPlugin()
    order: Sequence[Any] = [ours, theirs] if exactcall_first else [theirs, ours]
    client = await Client.connect(server.address, plugins=list(order))
    async with build_worker(client, tq, [PaiAgent]):
        handle = await start(client, tq, prompt(bank.url, ("pai_pay", 10, who)))
        text = await handle.result()
    assert text.startswith("pai_pay ok:")  # the tool, then the model activity after it
    assert (await activity_types(handle))[-1] == "agent__pai_agent__model_request"
    assert paid(bank, who) == [(10, who)]


async def test_stored_history_replays() -> None:
    await assert_replays(
        HISTORIES, workflows=[PaiAgent], plugins=[PydanticAIPlugin(), exactcall.Plugin(tools=[])]
    )


# -- bad input ---------------------------------------------------------------------------------
def test_bad_toolsets_and_approvals_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="at least one exactcall tool"):
        toolset()
    with pytest.raises(exactcall.UnknownTool, match="decorate the function"):
        toolset(print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="listed twice"):
        toolset(pai_pay, "pai_pay")
    with pytest.raises(ValueError, match=r"not in this toolset"):
        toolset(pai_pay, requires_approval=["pai_hitl_pay"])
    with pytest.raises(TypeError, match="requires_approval="):
        toolset(pai_pay, requires_approval="pai_pay")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"key=\.\.\.\): 'pai_hitl_pay' is not one of its"):
        toolset(pai_pay, key={"pai_hitl_pay": lambda args: "k"})
    with pytest.raises(TypeError, match=r"the key of 'pai_pay' is 'to', not a function"):
        toolset(pai_pay, key={pai_pay: "to"})  # type: ignore[dict-item]
    from pydantic_ai import DeferredToolRequests, ToolCallPart

    call = ToolCallPart("pai_pay", {"bank": "b", "amount": 1, "to": "t"}, tool_call_id="c1")
    h = exactcall.intent_hash(pai_pay, "b", 1, "t")
    reqs = DeferredToolRequests(approvals=[call], metadata={"c1": {ARGS_HASH: h}})
    with pytest.raises(ValueError, match=r"no call with tool_call_id 'c2'.*pending: 'c1'"):
        approve(reqs, "c2", args_hash=h)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        approve(reqs, "c1", args_hash="yes")
    bare = DeferredToolRequests(approvals=[call])
    with pytest.raises(ValueError, match="carries no exactcall_args_hash"):
        approve(bare, "c1", args_hash=h)
    into = DeferredToolResults(approvals={"other": False})
    out = approve(reqs, "c1", args_hash=h, results=into)
    assert out is into and out.metadata["c1"] == {ARGS_HASH: h} and "other" in out.approvals


def test_without_pydantic_ai_the_import_error_says_which_extra() -> None:
    code = "import sys; sys.modules['pydantic_ai'] = None; import exactcall.pydantic_ai"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "pip install 'exactcall[pydantic-ai]'" in proc.stderr


# -- quickstart --------------------------------------------------------------------------------
@pytest.fixture
def quickstart_workers(server: DevServer, tq: str) -> Iterator[Callable[[], WorkerProcess]]:
    started: list[WorkerProcess] = []
    module = "exactcall.quickstart.pydantic_ai"

    def make() -> WorkerProcess:
        wp = WorkerProcess(
            server.address,
            tq,
            tools=[module],
            workflows=[module],
            plugins=[f"{module}:plugins"],
            crash_at=f"{quickstart.EXACTCALL_TOOL}:after_call:1",
            env={"EXACTCALL_QUICKSTART_CRASH_PLAIN": "1"},
            cwd=ROOT,
        )
        started.append(wp)
        return wp

    yield make
    for wp in started:
        wp.stop()


async def test_quickstart_plain_pays_twice_exactcall_once(
    client: Client,
    quickstart_workers: Callable[[], WorkerProcess],
    tq: str,
    bank: Bank,
) -> None:
    plain_to, exact_to = f"qs-plain-{uuid.uuid4().hex[:6]}", f"qs-exact-{uuid.uuid4().hex[:6]}"
    handles = [
        await client.start_workflow(
            wf.run, args=[bank.url, to], id=f"{to}-wf", task_queue=tq, result_type=str
        )
        for wf, to in ((quickstart.PlainAgent, plain_to), (quickstart.ExactcallAgent, exact_to))
    ]
    both = asyncio.ensure_future(asyncio.gather(*(h.result() for h in handles)))
    kills = 0
    while not both.done():
        worker = await quickstart_workers().started()
        died = asyncio.ensure_future(worker.killed())
        await asyncio.wait({both, died}, timeout=90, return_when=asyncio.FIRST_COMPLETED)
        if died.done():
            kills += 1
        elif not both.done():
            raise AssertionError(f"no progress: {worker.tail}")
    plain_text, exact_text = both.result()
    assert kills >= 1  # SIGKILLed right after a payment (one kill may catch both)
    assert bank.count(to=plain_to) == 2
    assert bank.count(to=exact_to) == 1
    assert plain_text.startswith("Paid 10 to " + plain_to)
    assert exact_text.startswith("Paid 10 to " + exact_to)
