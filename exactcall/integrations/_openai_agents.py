"""exactcall for the OpenAI Agents SDK on Temporal (``pip install 'exactcall[openai-agents]'``).

:func:`function_tool` turns an ``@exactcall.tool`` into an ``agents.FunctionTool`` whose
``on_invoke_tool`` runs in the workflow and calls :func:`exactcall.call`: the intent is
persisted, the key derived (step ``pay#1``, ``pay#2``: the tool's ordinal in the workflow, so
a re-run model turn with new tool-call ids keeps its keys), a crash is never blindly re-run
and the tool's own ``approval=`` makes the run wait, like any exactcall call. The model sees
the result as JSON text, and an exactcall refusal (a denied approval, a conflict, bad
arguments, ...) as a tool error it can answer, not as a crashed run.

For the SDK's own human-in-the-loop (``needs_approval=`` -> ``result.interruptions`` ->
``state.approve(item)``), :func:`approve` approves an interruption only when the hash a person
saw equals :func:`intent_hash` of that item's arguments, and the tool refuses to run a
natively approved call that was not approved through it.

Deterministic workflow code only: :func:`function_tool` and :func:`intent_hash` may be used
anywhere; :func:`approve` and the tool's invocation run inside the workflow.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_core
from temporalio import workflow

try:
    from agents import FunctionTool, RunContextWrapper, RunState
    from agents.function_schema import function_schema
    from agents.items import ToolApprovalItem
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "exactcall.openai_agents needs the OpenAI Agents SDK and its Temporal plugin: "
        "pip install 'exactcall[openai-agents]'"
    ) from exc

from exactcall import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalMissing,
    ExactcallError,
    InvalidCall,
    Tool,
)
from exactcall import args_hash as exactcall_args_hash
from exactcall.integrations._adapters import (
    MODEL_ERRORS,
    KeyFunction,
    ask_a_person,
    call_for_model,
    key_functions,
    register_error,
    resolve_tool,
    schema_function,
    split_arguments,
    step_of,
)

__all__ = ["ApprovalMismatch", "approve", "decide", "function_tool", "intent_hash"]

NeedsApproval = bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@register_error
class ApprovalMismatch(ExactcallError):
    """:func:`approve` was given a hash that is not the one of the item's arguments: the item
    was not approved (it stays pending)."""

    code = "ApprovalMismatch"


_REFUSALS: tuple[type[ExactcallError], ...] = (*MODEL_ERRORS, ApprovalMismatch)
"""What the model gets as a tool error instead of a failed workflow (see exactcall.adapters)."""


# -- the tool --------------------------------------------------------------------------------
@dataclasses.dataclass
class _ExactcallFunctionTool(FunctionTool):
    """A FunctionTool whose invocation is ``exactcall.call`` (kept by ``dataclasses.replace``)."""

    exactcall_tool: Tool | None = dataclasses.field(default=None, kw_only=True, repr=False)
    exactcall_key: KeyFunction | None = dataclasses.field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.on_invoke_tool = self._invoke  # bound once: the SDK compares it by identity

    async def _invoke(self, ctx: ToolContext[Any], raw: str) -> str:
        """Run in the workflow: the call through exactcall, its refusals as tool errors."""
        t = self._tool()
        try:
            named = _parsed(t, raw)
            step = step_of(t, named, self.exactcall_key)
            if await self._natively_gated(ctx, raw):
                _check_native_approval(t, ctx.tool_call_id, named)
            result = await call_for_model(t, named, step=step)
        except _REFUSALS as err:  # see exactcall.adapters
            return _error_text(err)
        return _result_text(result)

    def _tool(self) -> Tool:
        if self.exactcall_tool is None:
            raise ExactcallError(
                f"{self.name}: built without an exactcall tool; use "
                "exactcall.openai_agents.function_tool(tool)"
            )
        return self.exactcall_tool

    async def _natively_gated(self, ctx: ToolContext[Any], raw: str) -> bool:
        """Whether the SDK asked a person about this call (then it ran only once approved)."""
        setting = self.needs_approval
        if isinstance(setting, bool):
            return setting
        params = json.loads(raw) if raw and raw.strip() else {}
        verdict = setting(ctx, params, ctx.tool_call_id)
        return bool(await verdict if inspect.isawaitable(verdict) else verdict)


def function_tool(
    tool: Tool | str,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: NeedsApproval = False,
    strict_json_schema: bool = True,
    key: KeyFunction | None = None,
) -> FunctionTool:
    """An ``agents.FunctionTool`` that runs ``tool`` through :func:`exactcall.call`.

    Its JSON schema comes from the tool's signature, without ``idempotency_key``; its name is
    the tool's (or ``name=``), its description the tool's docstring (or ``description=``).
    ``needs_approval``: the SDK's own human-in-the-loop (a bool, or ``async (run_context,
    params, call_id) -> bool``); approve its interruptions with :func:`approve`. The tool's
    exactcall ``approval=`` applies as well, and is authoritative.
    ``key``: a function of the call's arguments that names its step (``lambda args:
    f"order-{args['order_id']}"``), so a model that repeats a call repeats no effect: the
    same arguments get the first call's result, others an ``IntentConflict``. Without it
    each call is a new step (``refund#1``, ``refund#2``). See :mod:`exactcall.adapters`.
    """
    t = resolve_tool(tool)
    tool_name = name or t.name
    if not _TOOL_NAME.match(tool_name):
        raise ValueError(
            f"exactcall tool {t.name!r}: {tool_name!r} is not a valid OpenAI tool name "
            "(1-64 letters, digits, '_' or '-'); pass function_tool(tool, name=...)"
        )
    keys = key_functions(key, [t], where="exactcall.openai_agents.function_tool")
    schema = function_schema(
        schema_function(t),
        name_override=tool_name,
        description_override=description,
        strict_json_schema=strict_json_schema,
    )
    return _ExactcallFunctionTool(
        name=tool_name,
        description=schema.description or "",
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=_unbound,
        strict_json_schema=strict_json_schema,
        needs_approval=needs_approval,
        exactcall_tool=t,
        exactcall_key=keys.get(t.name),
    )


async def _unbound(ctx: ToolContext[Any], raw: str) -> str:  # replaced in __post_init__
    raise ExactcallError("exactcall function tool used before it was built")


def _parsed(t: Tool, raw: str) -> dict[str, Any]:
    """The model's JSON arguments (InvalidCall if they are not a JSON object)."""
    try:
        parsed = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise InvalidCall(
            f"{t.name}: the arguments are not valid JSON ({exc}); send a JSON object",
            tool=t.name,
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidCall(f"{t.name}: the arguments must be a JSON object", tool=t.name)
    return parsed


def _hash_of(t: Tool, named: dict[str, Any]) -> str:
    args, kwargs = split_arguments(t, named)
    return t.hash(*args, **kwargs)


def _result_text(result: Any) -> str:
    """What the model sees of a result: a string as it is, anything else as JSON."""
    if isinstance(result, str):
        return result
    return pydantic_core.to_json(result).decode()


def _error_text(err: ExactcallError) -> str:
    """What the model sees of an exactcall refusal: JSON with the code, message and step."""
    body: dict[str, Any] = {"error": err.code, "message": err.message}
    for field in ("tool", "step", "args_hash"):
        if field in err.fields:
            body[field] = err.fields[field]
    return json.dumps(body)


# -- the SDK's own human-in-the-loop, bound to the hash ---------------------------------------
_BOUND: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def _bound() -> dict[str, str]:
    """call_id -> args hash approved through :func:`approve`, for this workflow instance."""
    instance = workflow.instance()
    found = _BOUND.get(instance)
    if found is None:
        found = _BOUND[instance] = {}
    return found


def intent_hash(item: ToolApprovalItem) -> str:
    """``exactcall.intent_hash`` of an interruption's call: the hash to show a person, and the
    one :func:`approve` requires."""
    t = _tool_of(item)
    return _hash_of(t, _parsed(t, item.arguments or ""))


def approve(state: RunState[Any], item: ToolApprovalItem, *, args_hash: str) -> None:
    """Approve the interruption ``item`` of an exactcall tool, only if ``args_hash`` is
    :func:`intent_hash` of its arguments; otherwise raise :class:`ApprovalMismatch` and leave
    it pending. Approves that one call (never ``always_approve``). Call it in the workflow
    that resumes the run (``Runner.run(agent, state)``): the tool checks the hash there."""
    if not workflow.in_workflow():
        raise ExactcallError(
            "exactcall.openai_agents.approve runs in the workflow that resumes the agent run "
            "(Runner.run(agent, state)): the tool checks the approved hash there"
        )
    if not item.call_id:
        raise InvalidCall(f"{item.tool_name}: the interruption has no call id", tool=item.tool_name)
    t = _tool_of(item)
    args, kwargs = split_arguments(t, _parsed(t, item.arguments or ""))
    canonical = t.canonical_args(args, kwargs)
    expected = exactcall_args_hash(t.name, canonical)
    if not t.same_call(args_hash, canonical):
        raise ApprovalMismatch(
            f"{item.tool_name} call {item.call_id}: the approval is for args hash {args_hash}, "
            f"but the call's arguments hash to {expected}; it was not approved and stays "
            "pending. Show the person the call's arguments and their hash again.",
            tool=item.tool_name,
            args_hash=args_hash,
            expected_hash=expected,
            call_id=item.call_id,
        )
    _bound()[item.call_id] = expected
    state.approve(item, always_approve=False)


async def decide(result: Any) -> RunState[Any]:
    """Ask exactcall's approvals about each interruption of an exactcall tool in ``result``
    (a run that stopped for ``needs_approval``), and return the run state with every answer
    applied, for ``Runner.run(agent, state)``. In the workflow.

    Each call waits, all at once, as ``exactcall approvals list`` shows it (step
    ``TOOL@CALL_ID``, its arguments and hash); ``exactcall approvals approve`` approves it
    through :func:`approve` (bound to the hash), ``deny`` or the tool's ``approval_timeout``
    rejects it with the reason the model then reads. Interruptions of other tools are left
    pending in the state, for the workflow to decide."""
    state = result.to_state()
    items = [i for i in result.interruptions if _exactcall_item(i)]

    async def one(item: ToolApprovalItem) -> None:
        t = _tool_of(item)
        try:
            grant = await ask_a_person(t, _parsed(t, item.arguments or ""), str(item.call_id))
        except (ApprovalDenied, ApprovalExpired) as err:
            state.reject(item, rejection_message=f"{err.code}: {err.message}")
            return
        approve(state, item, args_hash=grant.args_hash)

    await asyncio.gather(*(one(i) for i in items))
    return state


def _exactcall_item(item: ToolApprovalItem) -> bool:
    tools = getattr(item.agent, "tools", None) or []
    return any(isinstance(c, _ExactcallFunctionTool) and c.name == item.tool_name for c in tools)


def _check_native_approval(t: Tool, call_id: str, named: dict[str, Any]) -> None:
    """Refuse a natively gated call unless :func:`approve` bound its call id to this hash."""
    actual = _hash_of(t, named)
    approved = _bound().pop(call_id, None)
    if approved == actual:
        return
    how = (
        "it was approved without its hash (state.approve)"
        if approved is None
        else f"it was approved for args hash {approved}"
    )
    raise ApprovalMissing(
        f"{t.name} call {call_id} needs approval of args hash {actual}, but {how}; nothing "
        "ran. Approve interruptions with exactcall.openai_agents.approve(state, item, "
        "args_hash=...)",
        tool=t.name,
        args_hash=actual,
        call_id=call_id,
    )


def _tool_of(item: ToolApprovalItem) -> Tool:
    """The exactcall tool behind an interruption (looked up in the item's agent)."""
    agent = item.agent
    for candidate in getattr(agent, "tools", None) or []:
        if isinstance(candidate, _ExactcallFunctionTool) and candidate.name == item.tool_name:
            return candidate._tool()
    raise InvalidCall(
        f"interruption {item.call_id} of {item.tool_name!r} is not a call of a tool made with "
        "exactcall.openai_agents.function_tool on its agent; approve it with the SDK "
        "(state.approve) if it is not an exactcall tool",
        tool=item.tool_name,
    )
