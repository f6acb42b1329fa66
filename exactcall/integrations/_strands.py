"""exactcall for Strands Agents on Temporal (``pip install 'exactcall[strands]'``).

``tools(*tools)`` is what goes on ``TemporalAgent(tools=[...])`` of ``temporalio-strands-agents``
(run by its ``StrandsPlugin``): Strands runs each tool in the workflow, and each call runs
through ``exactcall.call`` (a persisted intent, a derived key, no blind re-run) instead of the
integration's ``activity_as_tool`` plain activity, which Temporal retries and so runs again
after a crash past the effect::

    agent = TemporalAgent(model="claude", tools=exactcall.strands.tools(pay))

The model sees each tool's signature (minus ``idempotency_key``) and docstring. Steps are
exactcall's ordinals (``pay#1``, ``pay#2``), never Strands' tool use ids; ``key=`` names a
call's step from its arguments instead (see :mod:`exactcall.adapters`).

Errors follow :mod:`exactcall.adapters`' one rule: a refusal reaches the model as an ``error``
tool result (``CODE: message``) and the run goes on. Any other error (an unknown outcome of an
``on_unknown="raise"`` tool, a worker set up wrong) fails the run: Strands hands a tool's
exceptions to the model, so it is carried past Strands and raised where the workflow's code
ends. That needs ``TemporalAgent(..., tool_executor=SequentialToolExecutor())``: Strands'
default concurrent executor runs each tool in a task of its own and drops what such a task
raises past ``except Exception`` (the agent then goes on without the tool's result).

A tool declared ``@exactcall.tool(approval=True)`` waits for exactcall's approval, bound to the
arguments' hash and listed by ``exactcall approvals list``. Strands' own interrupts are not
bound yet: use exactcall's approval for a tool that needs a person.

``temporalio-strands-agents`` needs ``mcp<2``, and ``exactcall[mcp]`` needs ``mcp>=2.3``: the
two extras cannot be installed in one environment.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

try:
    from strands.tools.decorator import FunctionToolMetadata
    from strands.types._events import ToolResultEvent
    from strands.types.tools import AgentTool, ToolResult, ToolSpec, ToolUse
    from temporalio.strands_agents import TemporalAgent  # noqa: F401 - the extra is there
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "exactcall.strands needs the Strands Agents SDK's Temporal integration: "
        "pip install 'exactcall[strands]' (it needs mcp<2: not in one environment with "
        "exactcall[mcp])"
    ) from exc

from exactcall import Tool
from exactcall.integrations._adapters import (
    MODEL_ERRORS,
    KeyFunction,
    KeyOption,
    call_for_model,
    key_functions,
    refusal_or_failure,
    resolve_tools,
    schema_function,
    step_of,
)

__all__ = ["ExactcallTool", "tools"]


def tools(*tools: Tool | str, key: KeyOption = None) -> list[ExactcallTool]:
    """Strands tools for ``TemporalAgent(tools=[...])``, one per exactcall tool
    (``@exactcall.tool`` or its name): each call the model makes runs through exactcall.

    ``key``: a function of a call's arguments that names its step, or a mapping of tool to such
    a function (see :mod:`exactcall.adapters`). Without it each call is a new step.
    """
    resolved = resolve_tools(tools, where="exactcall.strands.tools")
    keys = key_functions(key, resolved, where="exactcall.strands.tools")
    return [ExactcallTool(t, keys.get(t.name)) for t in resolved]


class ExactcallTool(AgentTool):
    """A Strands tool whose calls run through ``exactcall.call``; build it with :func:`tools`."""

    def __init__(self, t: Tool, key: KeyFunction | None = None) -> None:
        super().__init__()
        self._tool = t
        self._key = key
        spec = FunctionToolMetadata(schema_function(t)).extract_metadata()
        spec["name"] = t.name
        self._spec: ToolSpec = spec

    @property
    def tool_name(self) -> str:
        return self._tool.name

    @property
    def tool_spec(self) -> ToolSpec:
        return self._spec

    @property
    def tool_type(self) -> str:
        return "exactcall"

    async def stream(
        self, tool_use: ToolUse, invocation_state: dict[str, Any], **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        t, named = self._tool, dict(tool_use.get("input") or {})
        try:
            step = step_of(t, named, self._key)
            result = await call_for_model(t, named, step=step)
        except Exception as err:
            carried = refusal_or_failure(err)
            if carried is err and isinstance(err, MODEL_ERRORS):  # a refusal: the model reads
                yield _result(tool_use, "error", f"{err.code}: {err.message}")
                return
            raise carried from None  # escapes Strands' `except Exception`: the run fails
        yield _result(tool_use, "success", json.dumps(result, default=str))


def _result(tool_use: ToolUse, status: Any, text: str) -> ToolResultEvent:
    return ToolResultEvent(
        ToolResult(toolUseId=tool_use["toolUseId"], status=status, content=[{"text": text}])
    )
