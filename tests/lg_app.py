"""The LangGraph agents the tests run: tools, graphs, workflows and the worker's plugin factory.

A worker process loads it with ``--tools tests.lg_app --workflows tests.lg_app --plugin
tests.lg_app:plugins``. The model is a scripted fake chat model (no network): each turn of
``script`` is a list of tool calls; when the script is done it answers with the tool results.
Its tool call ids are random, as a real model's are, so a re-run model turn gets new ids.

``python -m tests.lg_app`` regenerates ``tests/histories/lg/`` on its own dev server.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run the importable module: tool names must have one origin
    from tests.lg_app import main

    sys.exit(main())

import asyncio
import json
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        HumanMessage,
        ToolMessage,
        convert_to_messages,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.types import Command, interrupt
    from temporalio.langgraph import LangGraphPlugin, graph
    from typing_extensions import TypedDict

    import exactcall
    import exactcall.langgraph as xlg
    from exactcall.quickstart._common import find_payment, pay_at_bank

FAST = timedelta(seconds=2)
HISTORIES = Path(__file__).parent / "histories" / "lg"


# -- tools ---------------------------------------------------------------------------------
@exactcall.tool(heartbeat_timeout=FAST, reconcile=find_payment)
async def lg_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(heartbeat_timeout=FAST, approval=True)
async def lg_approved_pay(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay, once a person approved these exact arguments (exactcall's approval)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(heartbeat_timeout=FAST)
async def lg_gated_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay, once the graph's interrupt was resumed with the hash of these arguments."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(heartbeat_timeout=FAST)
async def lg_pay_once(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` (one payment per account: the node's key function)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


TOOLS = (lg_pay, lg_approved_pay, lg_gated_pay)


def pay_key(args: dict[str, Any]) -> str:
    """A business key: one payment per payee, however often the model asks."""
    return f"pay-to-{args['to']}"


# -- the model ------------------------------------------------------------------------------
class ScriptedModel(BaseChatModel):
    """A chat model that plays a script: one turn of tool calls per AI message so far."""

    script: list[list[dict[str, Any]]] = []
    bound: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
        return self.model_copy(update={"bound": names})

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages))])

    def answer(self, messages: Sequence[BaseMessage]) -> AIMessage:
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        if turn < len(self.script):
            calls = [self._call(c) for c in self.script[turn]]
            return AIMessage(content="", tool_calls=calls)
        results = [
            f"{m.name}:{m.status}:{m.content}" for m in messages if isinstance(m, ToolMessage)
        ]
        return AIMessage(content="done. " + " | ".join(results))

    def _call(self, c: dict[str, Any]) -> dict[str, Any]:
        if c["name"] not in self.bound:
            raise ValueError(f"the script calls {c['name']}, which is not bound: {self.bound}")
        call_id = c["id"] if "id" in c else f"call_{uuid.uuid4().hex[:12]}"
        return {"name": c["name"], "args": c["args"], "id": call_id}


class AgentState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    script: list[list[dict[str, Any]]]


async def model(state: AgentState) -> dict[str, Any]:
    """The model turn (an activity): the scripted model bound to the exactcall tools."""
    llm = ScriptedModel(script=state["script"]).bind_tools(xlg.tools(*TOOLS))
    reply = await llm.ainvoke(convert_to_messages(state["messages"]))
    return {"messages": [reply]}


async def keyed_model(state: AgentState) -> dict[str, Any]:
    """The model turn of the keyed graph: bound to lg_pay_once."""
    llm = ScriptedModel(script=state["script"]).bind_tools(xlg.tools(lg_pay_once, key=pay_key))
    reply = await llm.ainvoke(convert_to_messages(state["messages"]))
    return {"messages": [reply]}


async def route(state: AgentState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


async def pay_then_confirm(state: AgentState) -> dict[str, Any]:
    """A hand-written node: pays through the LangChain tool, THEN asks to confirm with an
    interrupt. LangGraph re-runs the whole node on resume, payment included."""
    [pay_tool] = xlg.tools(lg_pay)
    last = state["messages"][-1]
    out = [await pay_tool.ainvoke({**c, "type": "tool_call"}) for c in last.tool_calls]
    interrupt({"confirm": [m.content for m in out]})
    return {"messages": out}


def graphs() -> dict[str, StateGraph]:
    """Fresh graphs (LangGraphPlugin rewrites the nodes of the graphs it is given)."""
    agent = StateGraph(AgentState)
    agent.add_node("model", model, metadata={"execute_in": "activity"})
    agent.add_node(
        "tools",
        xlg.tool_node(*TOOLS, interrupt_on=[lg_gated_pay]),
        metadata={"execute_in": "workflow"},
    )
    agent.add_edge(START, "model")
    agent.add_conditional_edges("model", route, ["tools", END])
    agent.add_edge("tools", "model")

    confirm = StateGraph(AgentState)
    confirm.add_node("model", model, metadata={"execute_in": "activity"})
    confirm.add_node("tools", pay_then_confirm, metadata={"execute_in": "workflow"})
    confirm.add_edge(START, "model")
    confirm.add_conditional_edges("model", route, ["tools", END])
    confirm.add_edge("tools", "model")

    keyed = StateGraph(AgentState)
    keyed.add_node("model", keyed_model, metadata={"execute_in": "activity"})
    keyed.add_node(
        "tools", xlg.tool_node(lg_pay_once, key=pay_key), metadata={"execute_in": "workflow"}
    )
    keyed.add_edge(START, "model")
    keyed.add_conditional_edges("model", route, ["tools", END])
    keyed.add_edge("tools", "model")
    return {"lg_agent": agent, "lg_confirm": confirm, "lg_keyed": keyed}


def plugins() -> list[Any]:
    """The worker's LangGraph plugin (``--plugin tests.lg_app:plugins``)."""
    return [
        LangGraphPlugin(
            graphs=graphs(), default_activity_options={"start_to_close_timeout": FAST * 15}
        )
    ]


# -- the workflow ---------------------------------------------------------------------------
@workflow.defn(name="LgAgent")
class LgAgent:
    """Runs a graph to its end; each interrupt waits for a ``resume`` signal (its value is
    the ``Command(resume=...)`` value)."""

    def __init__(self) -> None:
        self._resumes: list[Any] = []
        self._waiting: list[Any] = []  # the pending interrupts

    @workflow.signal
    def resume(self, value: Any) -> None:
        self._resumes.append(value)

    @workflow.query
    def waiting(self) -> list[Any]:
        """The values of the pending interrupts."""
        return [i.value for i in self._waiting]

    @workflow.query
    def approvals(self) -> list[dict[str, Any]]:
        """The pending interrupts that ask to approve an exactcall tool call."""
        return xlg.approval_requests(self._waiting)

    @workflow.run
    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        app = graph(req.get("graph", "lg_agent")).compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": workflow.info().workflow_id}}
        start = {"messages": [HumanMessage("pay as scripted")], "script": req["script"]}
        out = await app.ainvoke(start, config, version="v2")
        while out.interrupts:
            if req.get("decide"):  # answered from exactcall's approvals
                out = await app.ainvoke(await xlg.decide(out.interrupts), config, version="v2")
                continue
            self._waiting = list(out.interrupts)
            await workflow.wait_condition(lambda: bool(self._resumes))
            self._waiting = []
            out = await app.ainvoke(Command(resume=self._resumes.pop(0)), config, version="v2")
        return summary(out.value["messages"])


def summary(messages: Sequence[BaseMessage]) -> dict[str, Any]:
    """The agent's final answer and every tool message it saw."""
    msgs = convert_to_messages(messages)
    tools = [
        {
            "name": m.name,
            "tool_call_id": m.tool_call_id,
            "status": m.status,
            "content": m.content,
            "exactcall": (m.artifact or {}).get("exactcall"),
        }
        for m in msgs
        if isinstance(m, ToolMessage)
    ]
    return {"answer": msgs[-1].content, "tools": tools}


def pay_call(tool: str, bank: str, amount: Any, to: str) -> dict[str, Any]:
    """One scripted tool call."""
    return {"name": tool, "args": {"bank": bank, "amount": amount, "to": to}}


# -- the stored history ---------------------------------------------------------------------
async def record_history(address: str, bank: str) -> Path:
    """Run one agent (two turns, two payments) and write its history to tests/histories/lg."""
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address, plugins=[exactcall.Plugin(), *plugins()])
    tq = f"lg-history-{uuid.uuid4().hex[:8]}"
    script = [[pay_call("lg_pay", bank, 10, "alice")], [pay_call("lg_pay", bank, 20, "bob")]]
    async with Worker(client, task_queue=tq, workflows=[LgAgent]):
        handle = await client.start_workflow(
            LgAgent.run, {"script": script}, id="lg-history-agent", task_queue=tq
        )
        await handle.result()
        history = await handle.fetch_history()
    HISTORIES.mkdir(parents=True, exist_ok=True)
    path = HISTORIES / "agent.json"
    path.write_text(json.dumps(history.to_json_dict(), indent=1) + "\n")
    return path


def main() -> int:
    import tempfile

    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer

    with (
        tempfile.TemporaryDirectory() as tmp,
        Bank(Path(tmp) / "bank.db") as bank,
        DevServer(fast=True) as server,
    ):
        path = asyncio.run(record_history(server.address, bank.url))
    print(f"wrote {path}")
    return 0
