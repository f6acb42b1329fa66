"""The quickstart's LangGraph agents: one payment, with and without exactcall.

Both run the same graph on ``temporalio-langgraph``: a model node (an activity; a fake chat
model, no network) that reads the bank and the account from its prompt and calls the pay tool
once, then a tools node in the workflow, then the model again for the final answer.
``PlainAgent``'s tool runs a plain Temporal activity (``lg_quickstart_plain_pay``);
``ExactcallAgent``'s goes through ``exactcall.langgraph.tool_node``. ``exactcall quickstart``
SIGKILLs the worker right after the payment in both and counts payments at the bank: two
for the plain agent (the retried activity paid again), one for exactcall (the probe found it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        ToolMessage,
        convert_to_messages,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langchain_core.tools import tool as lc_tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from temporalio.langgraph import LangGraphPlugin, graph

    import exactcall
    import exactcall.langgraph as xlg
    from exactcall.quickstart._common import crash_after_plain_effect, find_payment, pay_at_bank

__all__ = [
    "EXACTCALL_TOOL",
    "EXTRA",
    "FRAMEWORK",
    "ExactcallAgent",
    "PlainAgent",
    "plugins",
]

FRAMEWORK = "LangGraph"
EXTRA = "langgraph"
EXACTCALL_TOOL = "lg_quickstart_pay"
PLAIN_ACTIVITY = "lg_quickstart_plain_pay"
FAST = timedelta(seconds=2)
_PROMPT = "Pay 10 to the account {account} at the bank {bank}."
_ASKED = re.compile(r"account (?P<account>\S+) at the bank (?P<bank>\S+?)\.?$")


# -- the pay tools --------------------------------------------------------------------------
@activity.defn(name=PLAIN_ACTIVITY)
async def plain_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """The plain Temporal activity: pays, then (in the quickstart) the worker is killed."""
    receipt = await pay_at_bank(bank, amount, to)
    crash_after_plain_effect()
    return receipt


@exactcall.tool(name=EXACTCALL_TOOL, heartbeat_timeout=FAST, reconcile=find_payment)
async def pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@lc_tool(PLAIN_ACTIVITY)
async def plain_pay_tool(bank: str, amount: int, to: str) -> str:
    """Pay `amount` to the account `to` at the bank."""
    receipt = await workflow.execute_activity(
        plain_pay, args=[bank, amount, to], start_to_close_timeout=FAST * 30, heartbeat_timeout=FAST
    )
    return json.dumps(receipt)


# -- the fake model -------------------------------------------------------------------------
class QuickstartModel(BaseChatModel):
    """Reads "account X at the bank URL" from the prompt, calls the bound tool once, then
    answers with the receipt."""

    bound: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "exactcall-quickstart"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> QuickstartModel:
        names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
        return self.model_copy(update={"bound": names})

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages))])

    def answer(self, messages: Sequence[BaseMessage]) -> AIMessage:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        if done:
            return AIMessage(content=_final_text(done[-1]))
        asked = _ASKED.search(str(messages[0].content))
        if asked is None or not self.bound:
            return AIMessage(content="I need an account, a bank and a pay tool.")
        args = {"bank": asked["bank"], "amount": 10, "to": asked["account"]}
        return AIMessage(content="", tool_calls=[{"name": self.bound[0], "args": args, "id": "1"}])


def _final_text(m: ToolMessage) -> str:
    if m.status == "error":
        return f"I could not pay: {m.content}"
    receipt = json.loads(str(m.content))  # the bank's receipt, or its row when a probe found it
    to = receipt.get("to", receipt.get("to_account"))
    payment = receipt.get("payment_id", receipt.get("id"))
    return f"Paid {receipt['amount']} to {to} (payment {payment})."


async def _model_turn(state: MessagesState, tools: Sequence[BaseTool]) -> dict[str, Any]:
    llm = QuickstartModel().bind_tools(tools)
    return {"messages": [await llm.ainvoke(convert_to_messages(state["messages"]))]}


async def plain_model(state: MessagesState) -> dict[str, Any]:
    """The plain agent's model turn (an activity)."""
    return await _model_turn(state, [plain_pay_tool])


async def exactcall_model(state: MessagesState) -> dict[str, Any]:
    """The exactcall agent's model turn (an activity)."""
    return await _model_turn(state, xlg.tools(pay))


async def _route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


# -- graphs, plugin, workflows --------------------------------------------------------------
async def _plain_tools(state: MessagesState, config: RunnableConfig) -> Any:
    return await ToolNode([plain_pay_tool]).ainvoke(state, config)


def _agent_graph(model: Any, tools: Any) -> StateGraph:
    g = StateGraph(MessagesState)
    g.add_node("model", model, metadata={"execute_in": "activity"})
    g.add_node("tools", tools, metadata={"execute_in": "workflow"})
    g.add_edge(START, "model")
    g.add_conditional_edges("model", _route, ["tools", END])
    g.add_edge("tools", "model")
    return g


def plugins() -> list[Any]:
    """LangGraphPlugin with both agents' graphs (fresh ones: the plugin rewrites nodes)."""
    graphs = {
        "lg_quickstart_plain": _agent_graph(plain_model, _plain_tools),
        "lg_quickstart_exactcall": _agent_graph(exactcall_model, xlg.tool_node(pay)),
    }
    return [
        LangGraphPlugin(
            graphs=graphs, default_activity_options={"start_to_close_timeout": FAST * 30}
        )
    ]


async def _run(graph_name: str, bank: str, account: str) -> str:
    app = graph(graph_name).compile()
    prompt = HumanMessage(_PROMPT.format(account=account, bank=bank))
    out = await app.ainvoke({"messages": [prompt]})
    return str(out["messages"][-1].content)


@workflow.defn(name="QuickstartLgPlain")
class PlainAgent:
    """The agent on temporalio-langgraph alone: its pay tool is a plain activity."""

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        return await _run("lg_quickstart_plain", bank, account)


@workflow.defn(name="QuickstartLgExactcall")
class ExactcallAgent:
    """The same agent with its pay tool through exactcall.langgraph.tool_node."""

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        return await _run("lg_quickstart_exactcall", bank, account)
