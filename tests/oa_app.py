"""The OpenAI Agents SDK app of tests/test_openai_agents.py: tools, a scripted model, workflows.

A worker process serves it with ``exactcall worker --tools tests.oa_app --workflows
tests.oa_app --plugin tests.oa_app:plugins`` (cwd: the repository root).

The model is scripted by the prompt: a JSON object ``{"turns": [[{"tool": NAME, "args":
{...}}, ...], ...], "final": TEXT}``. Each turn is one model response with those tool calls
(run in parallel by the SDK); after the last turn the model answers with JSON text
``{"final": TEXT, "outputs": [every tool output it saw, in order]}``. Tool-call ids are random,
as a real model's are, so a re-run model turn gets new ones.

``python -m tests.oa_app`` regenerates ``tests/histories/oa/`` on its own dev server.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow

import exactcall
from exactcall.demo.bank_client import payments_with_key, post_payment

with workflow.unsafe.imports_passed_through():
    from agents import Agent, ModelProvider, ModelResponse, Runner, Usage, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin

    from exactcall import openai_agents as oa

if __name__ == "__main__":  # run the importable module: tool names must have one origin
    import importlib

    importlib.import_module("tests.oa_app").main()

FAST = timedelta(seconds=2)
HISTORIES = Path(__file__).parent / "histories" / "oa"


# -- tools -----------------------------------------------------------------------------------
def find_oa_payment(intent: exactcall.Intent) -> exactcall.Landed | exactcall.NotLanded:
    """Probe of ``oa_pay``: did the bank book a payment under the call's key?"""
    rows = payments_with_key(str(intent.args["bank"]), intent.key)
    if not rows:
        return exactcall.NotLanded()
    row = rows[0]
    return exactcall.Landed({"payment_id": row["id"], "to": row["to_account"], "probe": True})


@exactcall.tool(reconcile=find_oa_payment, heartbeat_timeout=FAST)
async def oa_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay ``amount`` to account ``to`` at the bank (the key travels as Idempotency-Key)."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
async def oa_approved_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay, once a person approved these exact arguments."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


@exactcall.tool(on_unknown="raise", heartbeat_timeout=FAST)
async def oa_pay_then_lose(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay, then lose the answer: an unknown outcome, raised (no probe)."""
    headers = exactcall.idempotency_headers()
    await asyncio.to_thread(post_payment, bank, amount, to, headers)
    raise ConnectionResetError("the answer was lost after the payment was sent")


def pay_key(args: dict[str, Any]) -> str:
    """A business key: one payment per payee (the model may ask twice)."""
    return f"pay-to-{args['to']}"


TOOLS = [
    oa.function_tool(oa_pay),
    oa.function_tool(oa_approved_pay),
    oa.function_tool(oa_pay_then_lose),
    oa.function_tool(oa_pay, name="oa_pay_once", key=pay_key),
    oa.function_tool(oa_pay, name="oa_pay_badkey", key=lambda args: args["amount"]),
]


async def over_100(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
    """A native approval policy: only payments over 100 need a person."""
    return int(params.get("amount", 0)) > 100


NATIVE_TOOLS = [
    oa.function_tool(oa_pay, needs_approval=True),
    oa.function_tool(oa_pay, name="oa_pay_now", description="Pay without asking anyone."),
    oa.function_tool(oa_pay, name="oa_pay_big", needs_approval=over_100),
]


# -- the scripted model ----------------------------------------------------------------------
def _items(input: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    return [i if isinstance(i, dict) else i.model_dump() for i in input]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


class ScriptedModel(Model):
    """Answers from the script in the first user message (see the module docstring)."""

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **kw: Any) -> Any:
        items = _items(input)
        script = json.loads(_text(next(i for i in items if i.get("role") == "user")["content"]))
        done = sum(1 for i in items if i.get("type") == "function_call")
        for turn in script.get("turns", []):
            if done < len(turn):
                return _response([_call(c["tool"], c["args"]) for c in turn])
            done -= len(turn)
        outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        return _response([_message(json.dumps({"final": script["final"], "outputs": outputs}))])

    def stream_response(self, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def _call(name: str, args: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        arguments=json.dumps(args),
        call_id=f"call_{uuid.uuid4().hex[:12]}",
        name=name,
        type="function_call",
        id=f"fc_{uuid.uuid4().hex[:12]}",
        status="completed",
    )


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex[:12]}",
        content=[ResponseOutputText(text=text, annotations=[], type="output_text")],
        role="assistant",
        status="completed",
        type="message",
    )


def _response(output: list[Any]) -> ModelResponse:
    return ModelResponse(output=output, usage=Usage(), response_id=None)


class ScriptedProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return ScriptedModel()


def openai_plugin() -> OpenAIAgentsPlugin:
    """The OpenAI Agents plugin with the scripted model (no network, no API key)."""
    set_tracing_disabled(True)  # no trace export, even with OPENAI_API_KEY set
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)),
        model_provider=ScriptedProvider(),
    )


def plugins() -> list[Any]:
    """``exactcall worker --plugin tests.oa_app:plugins``."""
    return [openai_plugin()]


def script(*turns: list[tuple[str, dict[str, Any]]], final: str = "done") -> dict[str, Any]:
    """A model script: each turn a list of (tool name, arguments)."""
    return {"turns": [[{"tool": n, "args": a} for n, a in t] for t in turns], "final": final}


# -- workflows -------------------------------------------------------------------------------
@workflow.defn(name="OaAgent")
class OaAgent:
    """An agent whose tools run through exactcall; returns the model's final JSON."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        agent = Agent(name="payer", instructions="Pay as asked.", tools=list(TOOLS))
        result = await Runner.run(agent, json.dumps(plan))
        return json.loads(result.final_output)


@workflow.defn(name="OaNativeHitl")
class OaNativeHitl:
    """The SDK's own human-in-the-loop: interruptions listed by query, decided by signal.

    A decision is ``{"call_id", "decision": "approve" | "sdk_approve" | "deny", "args_hash"}``:
    ``approve`` goes through exactcall.openai_agents.approve (bound to the hash), and
    ``sdk_approve`` calls the SDK's state.approve directly (which the tool then refuses).
    """

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self.decisions: list[dict[str, Any]] = []

    @workflow.query
    def interruptions(self) -> dict[str, Any]:
        return {"pending": self.pending, "rejected": self.rejected}

    @workflow.signal
    def decide(self, decision: dict[str, Any]) -> None:
        self.decisions.append(decision)

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        agent = Agent(name="payer", instructions="Pay as asked.", tools=list(NATIVE_TOOLS))
        result = await Runner.run(agent, json.dumps(plan))
        while result.interruptions:
            state = result.to_state()
            self.pending = [
                {
                    "call_id": i.call_id,
                    "tool": i.tool_name,
                    "arguments": i.arguments,
                    "args_hash": oa.intent_hash(i),
                }
                for i in result.interruptions
            ]
            for item in result.interruptions:
                await self._settle(state, item)
            self.pending = []
            result = await Runner.run(agent, state)
        return json.loads(result.final_output)

    async def _settle(self, state: Any, item: Any) -> None:
        """Wait for a decision on ``item``; a mismatched hash leaves it pending."""
        while True:
            await workflow.wait_condition(
                lambda: any(d["call_id"] == item.call_id for d in self.decisions)
            )
            d = next(d for d in self.decisions if d["call_id"] == item.call_id)
            self.decisions.remove(d)
            if d["decision"] == "deny":
                state.reject(item, rejection_message="a person denied this payment")
                return
            if d["decision"] == "sdk_approve":
                state.approve(item)
                return
            try:
                oa.approve(state, item, args_hash=d["args_hash"])
                return
            except oa.ApprovalMismatch as err:
                self.rejected.append(err.message)


@workflow.defn(name="OaDecided")
class OaDecided:
    """The SDK's own human-in-the-loop, answered from exactcall's approvals (oa.decide): the
    interruptions are listed by ``exactcall approvals list`` and decided by ``approve``."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> dict[str, Any]:
        agent = Agent(name="payer", instructions="Pay as asked.", tools=list(NATIVE_TOOLS))
        result = await Runner.run(agent, json.dumps(plan))
        while result.interruptions:
            result = await Runner.run(agent, await oa.decide(result))
        return json.loads(result.final_output)


# -- stored history --------------------------------------------------------------------------
async def _regenerate() -> None:
    """Run one agent (two parallel payments, then a second turn) and store its history."""
    from exactcall._worker import Connection, build_worker, connect
    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer

    with (
        DevServer(fast=True) as srv,
        tempfile.TemporaryDirectory() as tmp,
        Bank(Path(tmp) / "bank.db") as bank,
    ):
        client = await connect(Connection(address=srv.address), others=plugins())
        async with build_worker(client, "oa-histories", [OaAgent]):
            to = ("alice", "bob", "carol")
            calls = [("oa_pay", {"bank": bank.url, "amount": 10, "to": a}) for a in to]
            plan = script(calls[:2], calls[2:])  # two parallel calls, then one more turn
            handle = await client.start_workflow(
                OaAgent.run, plan, id="oa-history-agent", task_queue="oa-histories"
            )
            await handle.result()
            history = await handle.fetch_history()
    HISTORIES.mkdir(parents=True, exist_ok=True)
    out = HISTORIES / "agent.json"
    out.write_text(json.dumps(history.to_json_dict(), indent=1) + "\n")
    print(f"wrote {out}")


def main() -> None:
    """``python -m tests.oa_app``."""
    asyncio.run(_regenerate())
    os._exit(0)  # the SDK's trace exporter thread would otherwise hold the process
