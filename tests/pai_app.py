"""Pydantic AI agent, tools and workflow used by tests/test_pydantic_ai.py.

A worker process loads it with ``--tools tests.pai_app --workflows tests.pai_app --plugin
tests.pai_app:plugins`` (cwd: the repository root). The model is a scripted ``FunctionModel``
(no network): the prompt lists the calls to make, one per line (``pay: TOOL AMOUNT ACCOUNT``,
after a ``bank: URL`` line); the model makes them all in its first turn, then answers with one
line per tool result it saw.

    python -m tests.pai_app      # regenerate tests/histories/pai/ on its own dev server
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import (
        Agent,
        DeferredToolRequests,
        DeferredToolResults,
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    import exactcall
    import exactcall.pydantic_ai
    from exactcall.quickstart._common import find_payment, pay_at_bank

if __name__ == "__main__":  # `python -m tests.pai_app`: run the importable module, not a copy
    import importlib

    importlib.import_module("tests.pai_app").main()
    raise SystemExit(0)

HERE = Path(__file__).parent
HISTORIES = HERE / "histories" / "pai"
FAST = timedelta(seconds=2)


# -- tools -------------------------------------------------------------------------------------
@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
async def pai_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank whose URL is `bank`."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
async def pai_approved_pay(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay, once a person approved exactly this call (exactcall's own approval)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(heartbeat_timeout=FAST)
async def pai_hitl_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay, once approved through Pydantic AI's deferred tool requests."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


# -- the scripted model ------------------------------------------------------------------------
def _prompt(messages: list[ModelMessage]) -> str:
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and isinstance(p.content, str):
                    return p.content
    raise ValueError("the scripted model found no text prompt")


def planned_calls(prompt: str) -> list[ToolCallPart]:
    """The tool calls a prompt asks for (``bank: URL`` then ``pay: TOOL AMOUNT ACCOUNT`` lines)."""
    bank, calls = None, []
    for line in prompt.splitlines():
        head, _, rest = line.partition(":")
        if head.strip() == "bank":
            bank = rest.strip()
        elif head.strip() == "pay":
            tool, amount, to = rest.split()
            # no tool_call_id: Pydantic AI draws a random one, so a re-run turn gets new ids
            calls.append(ToolCallPart(tool, {"bank": bank, "amount": int(amount), "to": to}))
    return calls


def summary(messages: list[ModelMessage]) -> str:
    """One line per tool result in the conversation, ``TOOL ok|failed|retry: CONTENT [call
    ID]``: what the agent says at the end."""
    lines = []
    for m in messages:
        for p in m.parts if isinstance(m, ModelRequest) else ():
            if isinstance(p, ToolReturnPart):
                what = "ok" if p.outcome == "success" else p.outcome  # failed, denied, ...
                lines.append(f"{p.tool_name} {what}: {p.model_response_str()}")
            elif isinstance(p, RetryPromptPart):
                lines.append(f"{p.tool_name} retry: {p.model_response()}")
            else:
                continue
            lines[-1] += f" [call {p.tool_call_id}]"
    return "\n".join(lines)


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: the planned calls; after tool results: the summary as the final text."""
    last = messages[-1]
    answered = isinstance(last, ModelRequest) and any(
        isinstance(p, ToolReturnPart | RetryPromptPart) for p in last.parts
    )
    if answered:
        return ModelResponse(parts=[TextPart(summary(messages))])
    return ModelResponse(parts=list(planned_calls(_prompt(messages))))


agent = Agent(
    FunctionModel(scripted, model_name="pai-scripted"),
    name="pai_agent",
    output_type=[str, DeferredToolRequests],
    toolsets=[
        exactcall.pydantic_ai.toolset(
            pai_pay, pai_approved_pay, pai_hitl_pay, requires_approval=[pai_hitl_pay]
        )
    ],
    capabilities=[TemporalDurability()],
)


def prompt(bank: str, *calls: tuple[str, int, str]) -> str:
    """The prompt that makes the scripted model call ``calls`` (tool, amount, account)."""
    return "\n".join([f"bank: {bank}", *(f"pay: {t} {a} {to}" for t, a, to in calls)])


# -- the workflow ------------------------------------------------------------------------------
@workflow.defn(name="PaiAgent")
class PaiAgent:
    """Runs the agent; deferred approvals wait for the ``decide`` signal (human in the loop)."""

    __pydantic_ai_agents__ = (agent,)

    def __init__(self) -> None:
        self._requests: DeferredToolRequests | None = None
        self._results: DeferredToolResults | None = None

    @workflow.run
    async def run(self, text: str) -> str:
        result = await agent.run(text)
        while isinstance(result.output, DeferredToolRequests):
            self._requests = result.output
            await workflow.wait_condition(lambda: self._results is not None)
            decided, self._results, self._requests = self._results, None, None
            result = await agent.run(
                message_history=result.all_messages(), deferred_tool_results=decided
            )
        return result.output

    @workflow.query
    def pending_tool_calls(self) -> DeferredToolRequests | None:
        """The calls waiting for a decision (with their exactcall args hashes), if any."""
        return self._requests

    @workflow.signal
    def decide(self, results: DeferredToolResults) -> None:
        """Resume the run with these results (build them with exactcall.pydantic_ai.approve)."""
        self._results = results


@workflow.defn(name="PaiDecided")
class PaiDecided:
    """Deferred approvals answered from exactcall's approvals (exactcall.pydantic_ai.decide):
    listed by ``exactcall approvals list``, decided by ``exactcall approvals approve``."""

    __pydantic_ai_agents__ = (agent,)

    @workflow.run
    async def run(self, text: str) -> str:
        result = await agent.run(text)
        while isinstance(result.output, DeferredToolRequests):
            decided = await exactcall.pydantic_ai.decide(result.output)
            result = await agent.run(
                message_history=result.all_messages(), deferred_tool_results=decided
            )
        return result.output


# -- an agent whose one tool raises its unknown outcome (the adapters' one rule) ----------------
@exactcall.tool(on_unknown="raise", heartbeat_timeout=FAST)
async def pai_pay_then_lose(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay, then lose the answer: an unknown outcome, raised (no probe)."""
    await pay_at_bank(bank, amount, to, key=idempotency_key)
    raise ConnectionResetError("the answer was lost after the payment was sent")


losing_agent = Agent(
    FunctionModel(scripted, model_name="pai-scripted"),
    name="pai_losing_agent",
    toolsets=[exactcall.pydantic_ai.toolset(pai_pay_then_lose)],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="PaiLosingAgent")
class PaiLosingAgent:
    __pydantic_ai_agents__ = (losing_agent,)

    @workflow.run
    async def run(self, text: str) -> str:
        return (await losing_agent.run(text)).output


# -- a toolset with a business key: one payment per payee (issue 21 item 6) ---------------------
@exactcall.tool(heartbeat_timeout=FAST)
async def pai_pay_once(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` (one payment per account, whatever the model asks)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


keyed_agent = Agent(
    FunctionModel(scripted, model_name="pai-scripted"),
    name="pai_keyed_agent",
    toolsets=[
        exactcall.pydantic_ai.toolset(
            pai_pay_once, key={pai_pay_once: lambda args: f"pay-to-{args['to']}"}
        )
    ],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="PaiKeyedAgent")
class PaiKeyedAgent:
    __pydantic_ai_agents__ = (keyed_agent,)

    @workflow.run
    async def run(self, text: str) -> str:
        return (await keyed_agent.run(text)).output


def plugins() -> list[Any]:
    """The worker's framework plugin (``exactcall worker --plugin tests.pai_app:plugins``)."""
    return [PydanticAIPlugin()]


# -- stored history ----------------------------------------------------------------------------
async def _record(address: str, bank: str) -> None:
    from exactcall._worker import Connection, build_worker, connect

    client = await connect(Connection(address=address), others=plugins())
    async with build_worker(client, "pai-histories", [PaiAgent]):
        text = prompt(bank, ("pai_pay", 10, "alice"), ("pai_hitl_pay", 20, "bob"))
        handle = await client.start_workflow(
            PaiAgent.run, text, id="hist-pai-hitl", task_queue="pai-histories"
        )
        requests = None
        while requests is None:
            await asyncio.sleep(0.1)
            requests = await handle.query(PaiAgent.pending_tool_calls)
        [call] = requests.approvals
        h = requests.metadata[call.tool_call_id][exactcall.pydantic_ai.ARGS_HASH]
        await handle.signal(
            PaiAgent.decide, exactcall.pydantic_ai.approve(requests, call.tool_call_id, args_hash=h)
        )
        await handle.result()
        history = await handle.fetch_history()
    HISTORIES.mkdir(parents=True, exist_ok=True)
    out = HISTORIES / "hitl_agent.json"
    out.write_text(json.dumps(history.to_json_dict(), indent=1) + "\n")
    print(f"wrote {out}")


def main() -> None:
    """Regenerate the stored history on an embedded dev server of its own."""
    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer

    with (
        DevServer(fast=True) as srv,
        tempfile.TemporaryDirectory() as tmp,
        Bank(Path(tmp) / "bank.db") as bank,
    ):
        asyncio.run(_record(srv.address, bank.url))
