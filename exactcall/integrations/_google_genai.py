"""exactcall for the Google Gen AI SDK on Temporal (``pip install 'exactcall[google-genai]'``).

``tools(*tools)`` is what goes in ``GenerateContentConfig(tools=[...])`` of the
``TemporalAsyncClient`` that ``temporalio-google-genai``'s ``GoogleGenAIPlugin`` provides: the
SDK's automatic function calling (AFC) calls each one in the workflow, and each call runs
through ``exactcall.call`` (a persisted intent, a derived key, no blind re-run) instead of
``activity_as_tool``'s plain activity, which Temporal retries and so runs again after a crash
past the effect::

    response = await TemporalAsyncClient().models.generate_content(
        model="gemini-2.5-flash", contents=task,
        config=types.GenerateContentConfig(tools=exactcall.google_genai.tools(pay)))

The model sees each tool's signature (minus ``idempotency_key``) and docstring. Steps are
exactcall's ordinals (``pay#1``, ``pay#2``), never the model's function call ids; AFC never
re-runs a call that returned, so they are stable under replay, crashes and a resume. ``key=``
names a call's step from its arguments instead (see :mod:`exactcall.adapters`).

Errors follow :mod:`exactcall.adapters`' one rule. A refusal (:data:`MODEL_ERRORS
<exactcall.adapters.MODEL_ERRORS>`: a denied approval, a conflict, a definite failure...)
reaches the model as AFC's ``{"error": "... CODE: message"}`` function response and the run
goes on. Any other error (an unknown outcome of an ``on_unknown="raise"`` tool, a worker set up
wrong) fails the run: AFC hands every ``Exception`` to the model, so it is carried past AFC and
raised where the workflow's code ends. The SDK has no human-in-the-loop of its own: a tool
declared ``@exactcall.tool(approval=True)`` waits for exactcall's approval, bound to the
arguments' hash and listed by ``exactcall approvals list``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

try:
    from temporalio.google_genai import TemporalAsyncClient  # noqa: F401 - the extra is there
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "exactcall.google_genai needs the Google Gen AI SDK's Temporal integration: "
        "pip install 'exactcall[google-genai]'"
    ) from exc

from exactcall import ExactcallError, Tool
from exactcall.integrations._adapters import (
    KeyFunction,
    KeyOption,
    call_for_model,
    key_functions,
    refusal_or_failure,
    resolve_tools,
    schema_function,
    step_of,
)

__all__ = ["ToolRefused", "tool", "tools"]


class ToolRefused(Exception):
    """What AFC catches for an exactcall refusal: its text (``CODE: message``) is in the
    ``{"error": ...}`` function response the model reads."""


def tools(*tools: Tool | str, key: KeyOption = None) -> list[Callable[..., Any]]:
    """The callables to put in ``GenerateContentConfig(tools=[...])``, one per exactcall tool
    (``@exactcall.tool`` or its name): each call the model makes runs through exactcall.

    ``key``: a function of a call's arguments that names its step (``lambda args:
    f"order-{args['order_id']}"``), or a mapping of tool to such a function: a model that
    repeats a call repeats no effect. Without it each call is a new step (``pay#1``, ``pay#2``).
    """
    resolved = resolve_tools(tools, where="exactcall.google_genai.tools")
    keys = key_functions(key, resolved, where="exactcall.google_genai.tools")
    return [_callable(t, keys.get(t.name)) for t in resolved]


def tool(t: Tool | str, *, key: KeyFunction | None = None) -> Callable[..., Any]:
    """One tool's callable (see :func:`tools`)."""
    return tools(t, key=key)[0]


def _callable(t: Tool, key: KeyFunction | None) -> Callable[..., Any]:
    schema = schema_function(t)

    async def call(**named: Any) -> Any:
        try:
            step = step_of(t, named, key)
            return await call_for_model(t, named, step=step)
        except Exception as err:
            carried = refusal_or_failure(err)
            if carried is err and isinstance(err, ExactcallError):  # a refusal: the model reads
                raise ToolRefused(f"{err.code}: {err.message}") from err  # AFC's {"error": ...}
            raise carried from None  # escapes AFC's `except Exception`: the run fails

    call.__name__ = call.__qualname__ = t.name
    call.__doc__ = schema.__doc__
    call.__signature__ = inspect.signature(schema)  # type: ignore[attr-defined]
    call.__annotations__ = dict(schema.__annotations__)
    return call
