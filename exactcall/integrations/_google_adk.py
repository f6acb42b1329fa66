"""exactcall for Google ADK agents on Temporal (``pip install 'exactcall[google-adk]'``).

``tools(*tools)`` is what goes on ``Agent(tools=[...])`` of an ADK agent whose model is
``temporalio-google-adk``'s ``TemporalModel``, run by ``GoogleAdkPlugin``: ADK runs each tool
in the workflow, and each call runs through ``exactcall.call`` (a persisted intent, a derived
key, no blind re-run) instead of the integration's ``activity_as_tool`` plain activity, which
Temporal retries and so runs again after a crash past the effect::

    agent = Agent(name="payer", model=TemporalModel("gemini-2.5-flash"),
                  tools=exactcall.google_adk.tools(pay))

The model sees each tool's signature (minus ``idempotency_key``) and docstring. Steps are
exactcall's ordinals (``pay#1``, ``pay#2``), never ADK's function call ids; ``key=`` names a
call's step from its arguments instead (see :mod:`exactcall.adapters`).

ADK's ``require_confirmation`` is bound to the arguments' hash: ``tools(pay,
require_confirmation=[pay])`` pauses the run with ADK's ``adk_request_confirmation`` as usual,
but only a confirmation whose payload carries the hash of the arguments about to run
(``{"exactcall_args_hash": ...}``, built by :func:`approve` or :func:`decide`) releases the
call; a plain ``confirmed=True`` releases nothing. :func:`decide` lists each pending
confirmation in exactcall's approvals (``exactcall approvals list``, step ``TOOL@CALL_ID``) and
answers it from ``exactcall approvals approve`` / ``deny``.

Errors follow :mod:`exactcall.adapters`' one rule: a refusal reaches the model as ADK's
``{"error": "CODE: message"}`` tool response and the run goes on; any other error fails the run.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

try:
    from google.adk.tools import FunctionTool, ToolContext
    from google.genai import types
    from temporalio.google_adk import HitlRequest, hitl_confirmation_response
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "exactcall.google_adk needs Google ADK's Temporal integration: "
        "pip install 'exactcall[google-adk]'"
    ) from exc

from exactcall import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalMissing,
    ExactcallError,
    Tool,
    args_hash,
)
from exactcall.integrations._adapters import (
    MODEL_ERRORS,
    KeyFunction,
    KeyOption,
    ask_a_person,
    call_for_model,
    key_functions,
    refusal_or_failure,
    resolve_tool,
    resolve_tools,
    schema_function,
    some_of,
    split_arguments,
    step_of,
)

__all__ = ["ARGS_HASH", "approve", "decide", "tools"]

ARGS_HASH = "exactcall_args_hash"
"""The key of a confirmation's payload that binds it to one set of arguments."""


def tools(
    *tools: Tool | str,
    key: KeyOption = None,
    require_confirmation: bool | Collection[Tool | str] = False,
) -> list[FunctionTool]:
    """ADK tools for ``Agent(tools=[...])``, one per exactcall tool (``@exactcall.tool`` or its
    name): each call the model makes runs through exactcall.

    ``key``: a function of a call's arguments that names its step, or a mapping of tool to such
    a function (see :mod:`exactcall.adapters`). ``require_confirmation``: True for all, or the
    tools whose calls wait for ADK's tool confirmation, bound to the arguments' hash (answer
    with :func:`decide` or :func:`approve`).
    """
    resolved = resolve_tools(tools, where="exactcall.google_adk.tools")
    keys = key_functions(key, resolved, where="exactcall.google_adk.tools")
    confirm = some_of(require_confirmation, resolved, option="require_confirmation")
    return [
        FunctionTool(_callable(t, keys.get(t.name), t.name in confirm), require_confirmation=True)
        if t.name in confirm
        else FunctionTool(_callable(t, keys.get(t.name), False))
        for t in resolved
    ]


def approve(request: HitlRequest, *, args_hash: str, confirmed: bool = True) -> types.Part:
    """The part that answers ADK's confirmation ``request`` of an exactcall tool for exactly
    the arguments whose hash is ``args_hash`` (ValueError, nothing approved, if that is not the
    requested call's hash). Send it in ``types.Content(role="user", parts=[...])`` as
    ``runner.run_async(new_message=...)``."""
    t, named = _requested(request)
    requested = _hash(t, named)
    if args_hash != requested:
        raise ValueError(
            f"args_hash {args_hash} is not the hash of the requested call {t.name} "
            f"({request.interrupt_id}), which is {requested}: approve the call you reviewed. "
            "Nothing was approved"
        )
    return hitl_confirmation_response(
        request.interrupt_id, confirmed=confirmed, payload={ARGS_HASH: args_hash}
    )


async def decide(requests: Sequence[HitlRequest]) -> list[types.Part]:
    """Ask exactcall's approvals about each confirmation request of an exactcall tool in
    ``requests`` (from ``temporalio.google_adk.pending_hitl_requests``), all at once, and
    return the parts that answer them. In the workflow. Each is listed by ``exactcall
    approvals list`` (step ``TOOL@CALL_ID``, its arguments and hash); an approval confirms
    exactly that call, a denial or the tool's ``approval_timeout`` rejects it (ADK tells the
    model). Other requests are left out, for the workflow to answer."""

    async def one(request: HitlRequest) -> types.Part:
        t, named = _requested(request)
        try:
            await ask_a_person(t, named, request.interrupt_id)
        except (ApprovalDenied, ApprovalExpired):
            return hitl_confirmation_response(request.interrupt_id, confirmed=False)
        return approve(request, args_hash=_hash(t, named))

    mine = [r for r in requests if _is_ours(r)]
    return list(await asyncio.gather(*(one(r) for r in mine)))


def _callable(t: Tool, key: KeyFunction | None, confirmed: bool) -> Callable[..., Any]:
    schema = schema_function(t)
    sig = inspect.signature(schema)
    # ADK calls with keywords alone: every parameter keyword-only, then its context
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        p.replace(kind=keyword) for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD
    ]
    params.append(inspect.Parameter("tool_context", keyword, annotation=ToolContext))

    async def call(*, tool_context: ToolContext, **named: Any) -> Any:
        try:
            if confirmed:
                _check_confirmation(t, named, tool_context)
            step = step_of(t, named, key)
            return await call_for_model(t, named, step=step)
        except Exception as err:
            carried = refusal_or_failure(err)
            if carried is err and isinstance(err, MODEL_ERRORS):
                return {"error": f"{err.code}: {err.message}"}  # ADK's tool error: the model reads
            raise carried from None

    call.__name__ = call.__qualname__ = t.name
    call.__doc__ = schema.__doc__
    call.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    call.__annotations__ = {**schema.__annotations__, "tool_context": ToolContext}
    return call


def _check_confirmation(t: Tool, named: Mapping[str, Any], ctx: ToolContext) -> None:
    """Refuse (``ApprovalMissing``, which the model reads) a confirmation that is not for
    exactly these arguments. ADK itself refused a missing or rejected one before."""
    confirmation = ctx.tool_confirmation
    payload = confirmation.payload if confirmation is not None else None
    granted = payload.get(ARGS_HASH) if isinstance(payload, Mapping) else None
    args, kwargs = split_arguments(t, named)
    canonical = t.canonical_args(args, kwargs)
    if granted is None:
        raise ApprovalMissing(
            f"the confirmation of {t.name} carries no exactcall args hash (a plain "
            "confirmed=True releases nothing for an exactcall tool); answer with "
            "exactcall.google_adk.approve(request, args_hash=...) or decide(requests). "
            "Nothing ran",
            tool=t.name,
        )
    if not t.same_call(granted, canonical):
        raise ApprovalMissing(
            f"the confirmation of {t.name} is for args hash {granted}, but the arguments about "
            f"to run hash to {args_hash(t.name, canonical)}. Nothing ran",
            tool=t.name,
        )


def _is_ours(request: HitlRequest) -> bool:
    call = request.original_function_call or {}
    if request.kind != "tool_confirmation" or not call.get("name"):
        return False
    try:
        resolve_tool(call["name"])
    except (ExactcallError, LookupError, TypeError, ValueError):
        return False
    return True


def _requested(request: HitlRequest) -> tuple[Tool, dict[str, Any]]:
    call = request.original_function_call or {}
    if request.kind != "tool_confirmation" or not call.get("name"):
        raise ValueError(
            f"{request.interrupt_id} is not a tool confirmation request ({request.kind})"
        )
    return resolve_tool(call["name"]), dict(call.get("args") or {})


def _hash(t: Tool, named: Mapping[str, Any]) -> str:
    args, kwargs = split_arguments(t, named)
    return args_hash(t.name, t.canonical_args(args, kwargs))
