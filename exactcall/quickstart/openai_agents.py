"""Quickstart: one OpenAI Agents SDK agent pays 10 at the demo bank, twice over.

``PlainAgent`` runs on the SDK's own Temporal integration (``temporalio-openai-agents``) with
the payment as a plain activity (``activity_as_tool``); ``ExactcallAgent`` is the same agent
with the payment through ``exactcall.openai_agents.function_tool``. ``exactcall quickstart``
SIGKILLs the worker right after the payment in both: the plain activity is retried and pays
again; exactcall's tool is not re-sent, its probe finds the payment at the bank under the
call's key, and the agent finishes with that receipt.

The model is a fake (no network, no API key): it reads the bank URL and the account from the
prompt, calls the agent's one tool once, then answers with the receipt.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

import exactcall
from exactcall.quickstart._common import crash_after_plain_effect, find_payment, pay_at_bank

with workflow.unsafe.imports_passed_through():
    from agents import Agent, ModelProvider, ModelResponse, Runner, Usage, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from temporalio.openai_agents import OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

    from exactcall.openai_agents import function_tool

__all__ = [
    "EXACTCALL_TOOL",
    "EXTRA",
    "FRAMEWORK",
    "ExactcallAgent",
    "PlainAgent",
    "plugins",
]

FRAMEWORK = "OpenAI Agents SDK"
EXTRA = "openai-agents"
EXACTCALL_TOOL = "oa_quickstart_pay"
PLAIN_TOOL = "oa_quickstart_plain_pay"
AMOUNT = 10
INSTRUCTIONS = "You pay accounts at a bank with the tool you have, then report the receipt."
PROMPT = "Pay {amount} to account {account} at the bank {bank}."
_PROMPT = re.compile(r"Pay (\d+) to account (\S+) at the bank (\S+?)\.?$")
_PAYMENT_ID = re.compile(r"""["'](?:payment_id|id)["']:\s*(\d+)""")


# -- the payment, two ways -------------------------------------------------------------------
@activity.defn(name=PLAIN_TOOL)
async def oa_quickstart_plain_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay ``amount`` to account ``to`` at the bank (a plain Temporal activity)."""
    receipt = await pay_at_bank(bank, amount, to)
    crash_after_plain_effect()
    return receipt


@exactcall.tool(name=EXACTCALL_TOOL, reconcile=find_payment, heartbeat_timeout=timedelta(seconds=2))
async def oa_quickstart_pay(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay ``amount`` to account ``to`` at the bank (through exactcall, with the call's key)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


# -- the fake model --------------------------------------------------------------------------
class QuickstartModel(Model):
    """Calls the agent's one tool with the prompt's bank and account, then reports."""

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        *a: Any,
        **k: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        items = [i if isinstance(i, dict) else i.model_dump() for i in items]
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        if outputs:
            return _reply(_message(f"Paid. The bank's receipt: {_receipt(outputs[-1])}"))
        prompt = next(i for i in items if i.get("role") == "user")["content"]
        found = _PROMPT.search(prompt if isinstance(prompt, str) else prompt[0]["text"])
        if found is None:
            return _reply(_message("I need a prompt like: " + PROMPT))
        amount, account, bank = found.groups()
        args = {"bank": bank, "amount": int(amount), "to": account}
        return _reply(_tool_call(tools[0].name, args))

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError("the quickstart model does not stream")


def _receipt(output: str) -> str:
    """``payment N`` from a tool output (JSON from exactcall, a dict's repr from the plain
    activity: ``activity_as_tool`` returns ``str(result)``)."""
    found = _PAYMENT_ID.search(output)
    return f"payment {found.group(1)}" if found else output


def _tool_call(name: str, args: dict[str, Any]) -> ResponseFunctionToolCall:
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


def _reply(item: Any) -> ModelResponse:
    return ModelResponse(output=[item], usage=Usage(), response_id=None)


class QuickstartProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return QuickstartModel()


def plugins() -> list[Any]:
    """The SDK's Temporal plugin with the fake model (traces are not exported)."""
    set_tracing_disabled(True)  # nothing leaves the machine, even with OPENAI_API_KEY set
    return [OpenAIAgentsPlugin(model_provider=QuickstartProvider())]


# -- the two agents --------------------------------------------------------------------------
async def _run(agent: Agent[Any], bank: str, account: str) -> str:
    result = await Runner.run(agent, PROMPT.format(amount=AMOUNT, account=account, bank=bank))
    return str(result.final_output)


@workflow.defn(name="QuickstartOaPlain")
class PlainAgent:
    """The agent on the SDK's own Temporal integration: the payment is a plain activity."""

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        pay = activity_as_tool(
            oa_quickstart_plain_pay,
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=2),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)),
        )
        return await _run(
            Agent(name="payer", instructions=INSTRUCTIONS, tools=[pay]), bank, account
        )


@workflow.defn(name="QuickstartOaExactcall")
class ExactcallAgent:
    """The same agent with the payment through exactcall."""

    @workflow.run
    async def run(self, bank: str, account: str) -> str:
        pay = function_tool(oa_quickstart_pay)
        return await _run(
            Agent(name="payer", instructions=INSTRUCTIONS, tools=[pay]), bank, account
        )
