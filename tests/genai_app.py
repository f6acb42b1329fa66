"""Google Gen AI SDK agents on ``temporalio-google-genai``, used by tests/test_google_genai.py.

A worker process loads it with ``--tools tests.genai_app --workflows tests.genai_app --plugin
tests.genai_app:plugins`` (cwd: the repository root). The model is the package's own
``GeminiTestServer`` (the real plugin and activities, the HTTP layer scripted), answering from
the request instead of a fixed list, so a worker started again after a SIGKILL answers the
same: the prompt lists the calls (``bank: URL`` then ``pay: TOOL AMOUNT ACCOUNT`` lines), the
model makes them all in its first turn, then answers one line per function response it got.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from google.genai import types
    from temporalio.google_genai import TemporalAsyncClient, activity_as_tool
    from temporalio.google_genai.testing import GeminiTestServer, text_response

    import exactcall.google_genai
    from tests.agent_kit import (
        kit_approved_pay,
        kit_pay,
        kit_pay_then_lose,
        kit_plain_pay,
        planned,
        said,
    )

MODEL = "gemini-test"


# -- the scripted model ------------------------------------------------------------------------
def _parts(request: dict[str, Any]) -> list[dict[str, Any]]:
    contents = request.get("contents") or []
    return [p for c in contents for p in c.get("parts") or []]


def answer(request: dict[str, Any]) -> str:
    """The scripted model's response body to one ``generate_content`` request."""
    parts = _parts(request)
    responses = [p.get("functionResponse") or p.get("function_response") for p in parts]
    done = [r for r in responses if r]
    if done:
        lines = []
        for r in done:
            body = r.get("response") or {}
            lines.append(
                said(r.get("name"), "result" in body, body.get("result", body.get("error")))
            )
        return text_response("\n".join(lines))
    text = next(p["text"] for p in parts if p.get("text"))
    calls = [{"functionCall": {"name": tool, "args": args}} for tool, args in planned(text)]
    content = {"role": "model", "parts": calls}
    return json.dumps({"candidates": [{"content": content, "finishReason": "STOP"}]})


class ScriptedGemini(GeminiTestServer):
    """The package's test server, answering each request from what it asks."""

    def __init__(self) -> None:
        super().__init__([])

    def _next(self) -> str:
        return answer(self.requests[-1])


def plugins() -> list[Any]:
    """The worker's framework plugin (``exactcall worker --plugin tests.genai_app:plugins``)."""
    return [ScriptedGemini().plugin()]


# -- the agents --------------------------------------------------------------------------------
async def _generate(text: str, tools: list[Any]) -> str:
    response = await TemporalAsyncClient().models.generate_content(
        model=MODEL, contents=text, config=types.GenerateContentConfig(tools=tools)
    )
    return response.text or ""


@workflow.defn(name="GenaiAgent")
class GenaiAgent:
    @workflow.run
    async def run(self, text: str) -> str:
        return await _generate(
            text, exactcall.google_genai.tools(kit_pay, kit_approved_pay, kit_pay_then_lose)
        )


@workflow.defn(name="GenaiKeyedAgent")
class GenaiKeyedAgent:
    """One payment per payee, whatever the model asks."""

    @workflow.run
    async def run(self, text: str) -> str:
        return await _generate(
            text, exactcall.google_genai.tools(kit_pay, key=lambda args: f"to-{args['to']}")
        )


@workflow.defn(name="GenaiPlainAgent")
class GenaiPlainAgent:
    """The same agent on the integration's own ``activity_as_tool``: Temporal retries the
    activity after a crash past the payment, and it pays again."""

    @workflow.run
    async def run(self, text: str) -> str:
        config = ActivityConfig(
            start_to_close_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        return await _generate(text, [activity_as_tool(kit_plain_pay, activity_config=config)])
