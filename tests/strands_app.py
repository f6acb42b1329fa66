"""Strands agents on ``temporalio-strands-agents``, used by tests/test_strands.py (run in the
.venv-strands environment that .ci/run makes: the package needs mcp<2).

A worker process loads it with ``--tools tests.strands_app --workflows tests.strands_app
--plugin tests.strands_app:plugins`` (cwd: the repository root). The model is a scripted
Strands ``Model`` registered in ``StrandsPlugin(models=...)``, called by the integration's own
model activity (no network): the prompt lists the calls (``bank: URL`` then ``pay: TOOL
AMOUNT ACCOUNT`` lines), the model makes them all in its first turn, then answers one line per
tool result it got.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from strands.models import Model
    from strands.tools.executors import SequentialToolExecutor
    from temporalio.strands_agents import StrandsPlugin, TemporalAgent
    from temporalio.strands_agents.workflow import activity_as_tool

    import exactcall.strands
    from tests.agent_kit import (
        kit_approved_pay,
        kit_pay,
        kit_pay_then_lose,
        kit_plain_pay,
        planned,
        said,
    )

MODEL = "scripted"


# -- the scripted model ------------------------------------------------------------------------
class ScriptedModel(Model):
    """Plans the prompt's calls, then sums up the tool results."""

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError
        yield

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any
    ) -> AsyncGenerator[Any, None]:
        names = {
            b["toolUse"]["toolUseId"]: b["toolUse"]["name"]
            for m in messages
            for b in m["content"]
            if "toolUse" in b
        }
        results = [b["toolResult"] for b in messages[-1]["content"] if "toolResult" in b]
        yield {"messageStart": {"role": "assistant"}}
        if results:
            lines = [
                said(names.get(r["toolUseId"]), r["status"] == "success", r["content"][0]["text"])
                for r in results
            ]
            yield {"contentBlockDelta": {"delta": {"text": "\n".join(lines)}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        text = next(b["text"] for b in messages[0]["content"] if "text" in b)
        for i, (tool, args) in enumerate(planned(text)):
            use = {"toolUseId": f"call-{i}", "name": tool}
            yield {"contentBlockStart": {"start": {"toolUse": use}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(args)}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


def plugins() -> list[Any]:
    """The worker's framework plugin (``exactcall worker --plugin tests.strands_app:plugins``)."""
    return [StrandsPlugin(models={MODEL: ScriptedModel})]


# -- the agents --------------------------------------------------------------------------------
async def _run(tools: list[Any], text: str) -> str:
    agent = TemporalAgent(
        model=MODEL,
        tools=tools,
        start_to_close_timeout=timedelta(seconds=10),
        callback_handler=None,
        tool_executor=SequentialToolExecutor(),  # see exactcall.strands: an error must fail the run
    )
    result = await agent.invoke_async(text)
    return str(result).strip()


@workflow.defn(name="StrandsAgent")
class StrandsAgent:
    @workflow.run
    async def run(self, text: str) -> str:
        tools = exactcall.strands.tools(kit_pay, kit_approved_pay, kit_pay_then_lose)
        return await _run(tools, text)


@workflow.defn(name="StrandsKeyedAgent")
class StrandsKeyedAgent:
    """One payment per payee, whatever the model asks."""

    @workflow.run
    async def run(self, text: str) -> str:
        return await _run(exactcall.strands.tools(kit_pay, key=lambda a: f"to-{a['to']}"), text)


@workflow.defn(name="StrandsPlainAgent")
class StrandsPlainAgent:
    """The same agent on the integration's own ``activity_as_tool``: Temporal retries the
    activity after a crash past the payment, and it pays again."""

    @workflow.run
    async def run(self, text: str) -> str:
        tool = activity_as_tool(
            kit_plain_pay,
            start_to_close_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        return await _run([tool], text)
