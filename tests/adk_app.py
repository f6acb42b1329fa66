"""Google ADK agents on ``temporalio-google-adk``, used by tests/test_google_adk.py.

A worker process loads it with ``--tools tests.adk_app --workflows tests.adk_app --plugin
tests.adk_app:plugins`` (cwd: the repository root). The model is ADK's own ``TemporalModel``
(the model call is the integration's ``invoke_model`` activity) resolving the name
``exactcall-scripted`` to a scripted ``BaseLlm`` registered in ADK's ``LLMRegistry`` here (no
network): the prompt lists the calls (``bank: URL`` then ``pay: TOOL AMOUNT ACCOUNT`` lines),
the model makes them all in its first turn, then answers one line per tool response it got.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from google.adk.agents import Agent
    from google.adk.models import BaseLlm, LLMRegistry
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types
    from temporalio.google_adk import GoogleAdkPlugin, TemporalModel, pending_hitl_requests
    from temporalio.google_adk.workflow import activity_as_tool

    import exactcall.google_adk
    from tests.agent_kit import (
        kit_held_pay,
        kit_pay,
        kit_pay_then_lose,
        kit_plain_pay,
        planned,
        said,
    )

MODEL = "exactcall-scripted"


# -- the scripted model ------------------------------------------------------------------------
class ScriptedLlm(BaseLlm):
    """Plans the prompt's calls, then sums up the tool responses."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [MODEL]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        parts = [p for c in llm_request.contents for p in c.parts or []]
        done = [p.function_response for p in parts if p.function_response]
        if done:
            lines = []
            for r in done:
                body = r.response or {}
                lines.append(said(r.name, "error" not in body, body))
            reply = [types.Part(text="\n".join(lines))]
        else:
            reply = _planned(next(p.text for p in parts if p.text))
        yield LlmResponse(content=types.Content(role="model", parts=reply))


LLMRegistry.register(ScriptedLlm)


def _planned(text: str) -> list[types.Part]:
    return [
        types.Part(function_call=types.FunctionCall(name=tool, args=args))
        for tool, args in planned(text)
    ]


def plugins() -> list[Any]:
    """The worker's framework plugin (``exactcall worker --plugin tests.adk_app:plugins``)."""
    return [GoogleAdkPlugin()]


# -- the agents --------------------------------------------------------------------------------
async def run_agent(agent: Agent, text: str, answer: str = "decide") -> str:
    """Run the agent; answer each tool confirmation it asks for (``decide``: through
    exactcall's approvals; ``plain-yes``: ADK's confirmed=True without a hash), and go on."""
    runner = InMemoryRunner(agent=agent, app_name="payer")
    session = await runner.session_service.create_session(app_name="payer", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=text)])
    while True:
        pending, final = [], ""
        async for event in runner.run_async(
            user_id="u", session_id=session.id, new_message=message
        ):
            pending += pending_hitl_requests(event)
            if event.is_final_response() and event.content and event.content.parts:
                final = "".join(p.text or "" for p in event.content.parts)
        if not pending:
            return final
        if answer == "decide":
            parts = await exactcall.google_adk.decide(pending)
        else:  # the way ADK's docs answer: a yes that names no arguments
            from temporalio.google_adk import hitl_confirmation_response

            parts = [hitl_confirmation_response(r.interrupt_id, confirmed=True) for r in pending]
        message = types.Content(role="user", parts=parts)


def _agent(tools: list[Any]) -> Agent:
    return Agent(name="payer", model=TemporalModel(MODEL), tools=tools)


@workflow.defn(name="AdkAgent")
class AdkAgent:
    @workflow.run
    async def run(self, text: str, answer: str = "decide") -> str:
        tools = exactcall.google_adk.tools(
            kit_pay, kit_held_pay, kit_pay_then_lose, require_confirmation=[kit_held_pay]
        )
        return await run_agent(_agent(tools), text, answer)


@workflow.defn(name="AdkKeyedAgent")
class AdkKeyedAgent:
    """One payment per payee, whatever the model asks."""

    @workflow.run
    async def run(self, text: str) -> str:
        tools = exactcall.google_adk.tools(kit_pay, key=lambda args: f"to-{args['to']}")
        return await run_agent(_agent(tools), text)


@workflow.defn(name="AdkPlainAgent")
class AdkPlainAgent:
    """The same agent on the integration's own ``activity_as_tool``: Temporal retries the
    activity after a crash past the payment, and it pays again."""

    @workflow.run
    async def run(self, text: str) -> str:
        tool = activity_as_tool(
            kit_plain_pay,
            start_to_close_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        return await run_agent(_agent([tool]), text)
