"""The quickstart on Pydantic AI: one agent, paid once, twice over.

``PlainAgent`` is a Pydantic AI agent on its own Temporal integration (``TemporalDurability``)
whose pay tool runs in the framework's toolset activity, as usual; ``ExactcallAgent``
is the same agent with the pay tool through ``exactcall.pydantic_ai.toolset``. ``exactcall
quickstart`` runs both on worker processes started with ``--tools/--workflows
exactcall.quickstart.pydantic_ai --plugin exactcall.quickstart.pydantic_ai:plugins`` and
SIGKILLs them right after the payment: the toolset activity is retried and pays again; the
exactcall tool's next attempt asks the bank (its probe) and finds the payment.

The model is a scripted ``FunctionModel`` (no network, no API key): it reads the bank URL and
the account from the prompt, calls the pay tool once, then answers with the receipt.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import (
        Agent,
        FunctionToolset,
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    import exactcall
    from exactcall.pydantic_ai import toolset
    from exactcall.quickstart._common import crash_after_plain_effect, find_payment, pay_at_bank

__all__ = [
    "EXACTCALL_TOOL",
    "EXTRA",
    "FRAMEWORK",
    "ExactcallAgent",
    "PlainAgent",
    "pai_quickstart_pay",
    "plugins",
]

FRAMEWORK = "Pydantic AI"
EXTRA = "pydantic-ai"
EXACTCALL_TOOL = "pai_quickstart_pay"
AMOUNT = 10
_PROMPT = re.compile(r"Pay (?P<amount>\d+) to (?P<to>\S+) at (?P<bank>\S+?)\.?$")


# -- the payment, both ways --------------------------------------------------------------------
@exactcall.tool(name=EXACTCALL_TOOL, reconcile=find_payment, heartbeat_timeout=timedelta(seconds=2))
async def pai_quickstart_pay(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank whose URL is `bank`."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


_plain_tools = FunctionToolset(id="pai_quickstart_plain_tools")


# Pydantic AI's own Temporal integration runs this tool in its toolset activity (short timeouts,
# so the retry after the crash comes within seconds); the retry pays again
@_plain_tools.tool_plain(
    metadata={
        "temporal": ActivityConfig(
            start_to_close_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
    }
)
async def pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank whose URL is `bank`."""
    receipt = await pay_at_bank(bank, amount, to)
    crash_after_plain_effect()
    return receipt


# -- the scripted model ------------------------------------------------------------------------
def _pay_call(messages: list[ModelMessage], info: AgentInfo) -> ToolCallPart:
    for m in messages:
        for p in m.parts if isinstance(m, ModelRequest) else ():
            if isinstance(p, UserPromptPart) and isinstance(p.content, str):
                found = _PROMPT.search(p.content.strip())
                if found:
                    args = {"bank": found["bank"], "amount": int(found["amount"])}
                    args["to"] = found["to"]
                    return ToolCallPart(info.function_tools[0].name, args, tool_call_id="pay-1")
    raise ValueError("the quickstart model expects a prompt 'Pay N to ACCOUNT at BANK_URL.'")


def _answer(part: ToolReturnPart) -> str:
    if part.outcome != "success":
        return f"The payment failed: {part.model_response_str()}"
    r = part.content if isinstance(part.content, dict) else {}
    to, payment = r.get("to", r.get("to_account")), r.get("payment_id", r.get("id"))
    return f"Paid {r.get('amount')} to {to}: payment {payment}."  # a receipt, or the probe's row


def quickstart_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Pay once; once the tool answered, say what happened."""
    last = messages[-1]
    parts = last.parts if isinstance(last, ModelRequest) else []
    returned = [p for p in parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(_answer(returned[0]))])
    return ModelResponse(parts=[_pay_call(messages, info)])


def _agent(name: str, tools: Any) -> Agent[None, str]:
    return Agent(
        FunctionModel(quickstart_model, model_name="quickstart-scripted"),
        name=name,
        toolsets=[tools],
        capabilities=[TemporalDurability()],
    )


plain_agent = _agent("pai_quickstart_plain", _plain_tools)
exactcall_agent = _agent("pai_quickstart_exactcall", toolset(pai_quickstart_pay))


def _prompt(bank: str, account: str) -> str:
    return f"Pay {AMOUNT} to {account} at {bank}."


# -- the workflows -----------------------------------------------------------------------------
@workflow.defn(name="QuickstartPaiPlain")
class PlainAgent:
    """The agent on Pydantic AI's own Temporal integration; its payment runs in the
    framework's toolset activity."""

    __pydantic_ai_agents__ = (plain_agent,)

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        return (await plain_agent.run(_prompt(bank, account))).output


@workflow.defn(name="QuickstartPaiExactcall")
class ExactcallAgent:
    """The same agent with its payment through exactcall."""

    __pydantic_ai_agents__ = (exactcall_agent,)

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        return (await exactcall_agent.run(_prompt(bank, account))).output


def plugins() -> list[Any]:
    """Pydantic AI's Temporal plugin (the agents carry their scripted model)."""
    return [PydanticAIPlugin()]
