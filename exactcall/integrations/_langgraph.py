"""exactcall for LangGraph on Temporal (``temporalio-langgraph``): tool calls that happen once.

``tools(*tools)`` gives LangChain tools for ``model.bind_tools(...)``; ``tool_node(*tools)``
gives an async graph node, added with ``metadata={"execute_in": "workflow"}``, that runs the
model's tool calls through ``exactcall.call``::

    g.add_node("model", model_node, metadata={"execute_in": "activity"})
    g.add_node("tools", exactcall.langgraph.tool_node(pay), metadata={"execute_in": "workflow"})

Steps. LangGraph re-runs an interrupted node from its start when it resumes, so a call's step
cannot be "the next ordinal" each time the code runs. The first time this workflow run sees a
tool call id (the model's ``tool_call_id``, stable in graph state), it gives the call the
tool's next ordinal (``pay#1``) and remembers it: a node re-run on resume finds the same step,
and a reset (which replays from the start and may get new ids from the model) recomputes the
same ordinals, so both reach the same idempotency key. ``tool_node(..., key=lambda args:
f"order-{args['order_id']}")`` names the step from the call's arguments instead (see
:mod:`exactcall.adapters`): a model that repeats the call repeats no effect.

Approvals. A tool declared ``@exactcall.tool(approval=True)`` makes the node wait for
exactcall's own signal, bound to the argument hash. Or ``tool_node(..., interrupt_on=[pay])``
pauses the graph with LangGraph's ``interrupt()`` before any call of that model turn runs; its
value carries tool, args, args_hash, tool_call_id, step and key. Resume with
``Command(resume={"approve": True, "args_hash": ...})`` (``approve(args_hash)``): the call runs
only when that hash is the hash of the arguments about to run.

Tool errors (a refused or expired approval, an intent conflict, a hash mismatch on resume, a
definite failure, bad arguments) come back to the model as ``ToolMessage(status="error")``
with a text that says what happened, so the graph continues.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, cast

import pydantic
from pydantic_core import to_jsonable_python
from temporalio import workflow

from exactcall._wire import LANGGRAPH_APPROVAL_INTERRUPT as APPROVAL_INTERRUPT
from exactcall._wire import LANGGRAPH_CALL_ID_FIELD

try:
    from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, InjectedToolCallId, ToolException
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command, interrupt
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"exactcall.langgraph needs LangGraph ({exc}): pip install 'exactcall[langgraph]'"
    ) from exc

from exactcall import ApprovalDenied, ApprovalExpired, ExactcallError, InvalidCall, Tool
from exactcall.integrations._adapters import (
    MODEL_ERRORS,
    KeyFunction,
    KeyOption,
    ask_a_person,
    call_for_model,
    key_functions,
    next_step,
    planned_intent,
    resolve_tool,
    schema_function,
    step_of,
)

__all__ = [
    "APPROVAL_INTERRUPT",
    "ExactcallTool",
    "approval_requests",
    "approve",
    "decide",
    "deny",
    "tool_node",
    "tools",
]


TOOL_ERRORS: tuple[type[ExactcallError], ...] = MODEL_ERRORS
"""exactcall errors the model sees as a tool error; the others (an unknown outcome with
``on_unknown="raise"``, an unrecordable result) fail the run: a model that retried them
would start a new call."""

_STEPS: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], str]] = weakref.WeakKeyDictionary()
_NO_DECISION = object()
_DECISIONS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "exactcall_langgraph_decisions", default=None
)


# -- steps and outcomes ------------------------------------------------------------------
def _step_for(t: Tool, tool_call_id: str | None) -> str:
    """The step of the model's tool call ``tool_call_id`` of ``t`` in this workflow run: the
    tool's next ordinal the first time the id is seen, the same step every time after."""
    if not tool_call_id:
        return next_step(t)
    seen = _STEPS.setdefault(workflow.instance(), {})
    step = seen.get((t.name, tool_call_id))
    if step is None:
        step = next_step(t)
        seen[(t.name, tool_call_id)] = step
    return step


def _describe(
    t: Tool, args: Mapping[str, Any], tool_call_id: str | None, key: KeyFunction | None
) -> dict[str, Any]:
    """What a call is about to do: tool, canonical args, hash, step and key, as
    ``exactcall.call`` computes them (may raise InvalidCall for arguments that do not fit)."""
    step = step_of(t, args, key) or _step_for(t, tool_call_id)
    intent = planned_intent(t, args, step)
    return {
        "type": APPROVAL_INTERRUPT,
        "tool": t.name,
        "args": intent.args,
        "args_hash": intent.args_hash,
        "tool_call_id": tool_call_id,
        "step": intent.step,
        "key": intent.key,
    }


def _error_text(t: Tool, err: ExactcallError) -> str:
    return f"{t.name} error ({err.code}): {err.message}"


def _decision_refusal(t: Tool, call: Mapping[str, Any], decision: Any) -> str | None:
    """Why an interrupt's resume value does not approve this exact call (None: it does)."""
    where = f"{call['tool']} {call['step']}"
    if decision is _NO_DECISION:
        return (
            f"{where} needs approval (interrupt_on), but the model's tool call has no id, so no "
            "interrupt could be matched to it. Nothing ran."
        )
    if not isinstance(decision, Mapping) or not isinstance(decision.get("approve"), bool):
        return (
            f"{where}: the resume value {decision!r} is not an exactcall decision; resume with "
            'exactcall.langgraph.approve(args_hash) or Command(resume={"approve": True, '
            '"args_hash": ...}). Nothing ran.'
        )
    if not decision["approve"]:
        reason = decision.get("reason") or "no reason given"
        by = f" by {decision['by']}" if decision.get("by") else ""
        return f"{where} was denied{by}: {reason}. Nothing ran."
    if not t.same_call(decision.get("args_hash"), call["args"]):
        return (
            f"{where}: the approval is for args hash {decision.get('args_hash')!r}, but the "
            f"call has {call['args_hash']} (hash mismatch). Nothing ran."
        )
    return None


async def run_call(
    t: Tool,
    args: Mapping[str, Any],
    tool_call_id: str | None,
    gated: bool = False,
    key: KeyFunction | None = None,
) -> tuple[str, dict[str, Any] | None, bool]:
    """Run one model tool call through exactcall: ``(content, exactcall fields, ok)``.

    ``gated``: the call runs only if the node's interrupt was resumed with its exact hash.
    Not ok: ``content`` says why the call gave no result (one of ``TOOL_ERRORS``, or no
    resume value that approves it); ``fields`` (step, key, args_hash) is None when the
    arguments do not fit the tool."""
    try:
        call = _describe(t, args, tool_call_id, key)
    except InvalidCall as err:
        return _error_text(t, err), None, False
    fields = {k: call[k] for k in ("step", "key", "args_hash")}
    if gated:
        decision = (_DECISIONS.get() or {}).get(tool_call_id or "", _NO_DECISION)
        refusal = _decision_refusal(t, call, decision)
        if refusal is not None:
            workflow.logger.warning("exactcall approval.rejected (langgraph): %s", refusal)
            return refusal, fields, False
    try:
        result = await call_for_model(t, args, step=call["step"])
    except TOOL_ERRORS as err:
        return _error_text(t, err), fields, False
    return _content(result), fields, True


def _content(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(to_jsonable_python(result))


def _message(
    content: str, fields: dict[str, Any] | None, ok: bool, name: str, call_id: str
) -> ToolMessage:
    return ToolMessage(
        content=content,
        name=name,
        tool_call_id=call_id,
        status="success" if ok else "error",
        artifact={"exactcall": fields} if fields else None,
    )


# -- LangChain tools -----------------------------------------------------------------------
class ExactcallTool(BaseTool):
    """A LangChain tool whose run is ``exactcall.call`` (in a workflow, with a model ToolCall).

    Its schema is the exactcall tool's signature without ``idempotency_key``; bind it with
    ``model.bind_tools(...)``. Invoked with a ToolCall (``{"name", "args", "id", "type":
    "tool_call"}``) inside a workflow, it runs the call once under the step of that id."""

    exactcall_tool: Any
    key_function: Any = None
    handle_tool_error: bool = True

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise ExactcallError(
            f"{self.name} is an exactcall tool: it runs inside a Temporal workflow, async "
            "(await tool.ainvoke(tool_call), or exactcall.langgraph.tool_node)"
        )

    async def _arun(self, **kwargs: Any) -> Any:
        tool_call_id = kwargs.pop(LANGGRAPH_CALL_ID_FIELD, None)
        if not workflow.in_workflow():
            self._run()
        content, _fields, ok = await run_call(
            self.exactcall_tool, kwargs, tool_call_id, key=self.key_function
        )
        if not ok:
            raise ToolException(content)
        return content


def tools(*tools: Tool | str, key: KeyOption = None) -> list[BaseTool]:
    """LangChain tools for ``model.bind_tools(...)`` and ``ToolNode``: one per exactcall tool,
    with the tool's name, docstring and arguments (without ``idempotency_key``). ``key``: as
    :func:`tool_node`'s."""
    if not tools:
        raise TypeError("exactcall.langgraph.tools(*tools): give at least one exactcall tool")
    resolved = [resolve_tool(t) for t in tools]
    keys = key_functions(key, resolved, where="exactcall.langgraph.tools")
    return [_lc_tool(t, keys.get(t.name)) for t in resolved]


def _lc_tool(t: Tool, key: KeyFunction | None = None) -> ExactcallTool:
    return ExactcallTool(
        name=t.name,
        description=_description(t),
        args_schema=_schema(t),
        exactcall_tool=t,
        key_function=key,
    )


def _description(t: Tool) -> str:
    doc = (t.fn.__doc__ or "").strip()
    return doc.split("\n\n")[0].strip() or f"Call {t.name}."


def _schema(t: Tool) -> type[pydantic.BaseModel]:
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(schema_function(t)).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = ... if p.default is p.empty else p.default
        fields[name] = (p.annotation, default)
    fields[LANGGRAPH_CALL_ID_FIELD] = (Annotated[str, InjectedToolCallId], ...)
    return pydantic.create_model(f"{t.name}_args", **fields)


# -- the tool node -------------------------------------------------------------------------
def tool_node(
    *tools: Tool | str,
    interrupt_on: bool | Iterable[Tool | str] = False,
    messages_key: str = "messages",
    name: str = "tools",
    key: KeyOption = None,
) -> Callable[[Any, RunnableConfig], Any]:
    """An async graph node that runs the last AI message's tool calls through exactcall.

    Add it with ``metadata={"execute_in": "workflow"}``. ``interrupt_on``: True (every tool)
    or the tools whose calls pause the graph with ``interrupt()`` for approval first (one
    interrupt per call, all of a turn's before any of its calls runs). ``key``: a function of
    a call's arguments that names its step (``lambda args: f"order-{args['order_id']}"``),
    or a mapping of tool to such a function: a model that repeats a call repeats no effect
    (the same arguments get the first call's result, others an ``IntentConflict``). Without
    it each model tool call is a new step (``refund#1``, ``refund#2``)."""
    resolved = [resolve_tool(t) for t in tools]
    if not resolved:
        raise TypeError("exactcall.langgraph.tool_node(*tools): give at least one exactcall tool")
    by_name = {t.name: t for t in resolved}
    gated = _gated(interrupt_on, by_name)
    keys = key_functions(key, resolved, where="exactcall.langgraph.tool_node")
    node = ToolNode(
        [_lc_tool(t, keys.get(t.name)) for t in resolved],
        name=name,
        messages_key=messages_key,
        awrap_tool_call=_wrapper(by_name, gated, keys),
    )

    async def exactcall_tools(state: Any, config: RunnableConfig) -> Any:
        decisions = _ask(_tool_calls(state, messages_key), by_name, gated, keys)
        token = _DECISIONS.set(decisions)
        try:
            return await node.ainvoke(state, config)
        finally:
            _DECISIONS.reset(token)

    return exactcall_tools


def _gated(interrupt_on: bool | Iterable[Tool | str], by_name: Mapping[str, Tool]) -> set[str]:
    if interrupt_on is True:
        return set(by_name)
    if interrupt_on is False:
        return set()
    gated = {resolve_tool(t).name for t in interrupt_on}
    unknown = sorted(gated - set(by_name))
    if unknown:
        raise TypeError(
            f"interrupt_on names {unknown}, which are not tools of this node "
            f"({sorted(by_name)}): pass them to tool_node(*tools) too"
        )
    return gated


def _wrapper(
    by_name: Mapping[str, Tool], gated: set[str], keys: Mapping[str, KeyFunction]
) -> Callable[..., Any]:
    async def exactcall_wrap(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        c = request.tool_call
        t = by_name.get(c["name"])
        if t is None:  # not an exactcall tool of this node: ToolNode's own answer
            return await execute(request)
        content, fields, ok = await run_call(
            t, c.get("args") or {}, c.get("id"), gated=t.name in gated, key=keys.get(t.name)
        )
        return _message(content, fields, ok, t.name, c.get("id") or "")

    return exactcall_wrap


def _tool_calls(state: Any, messages_key: str) -> list[dict[str, Any]]:
    if isinstance(state, list):
        messages = state
    elif isinstance(state, Mapping):
        messages = state.get(messages_key) or []
    else:
        messages = getattr(state, messages_key, None) or []
    last = _last_ai(convert_to_messages(messages) if messages else [])
    return cast(list[dict[str, Any]], list(last.tool_calls)) if last is not None else []


def _last_ai(messages: Sequence[Any]) -> AIMessage | None:
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            return m
    return None


def _ask(
    calls: Sequence[Mapping[str, Any]],
    by_name: Mapping[str, Tool],
    gated: set[str],
    keys: Mapping[str, KeyFunction],
) -> dict[str, Any]:
    """Interrupt once per gated call (in order); the resume values, by tool call id. A gated
    call without an id is not asked: it cannot be matched to an answer, so it does not run."""
    decisions: dict[str, Any] = {}
    for c in calls:
        if c["name"] not in gated or not c.get("id"):
            continue
        try:
            name = c["name"]
            request = _describe(by_name[name], c.get("args") or {}, c["id"], keys.get(name))
        except InvalidCall:
            continue  # the call itself answers with the error
        decisions[c["id"]] = interrupt(request)
    return decisions


# -- resuming ------------------------------------------------------------------------------
def approve(args_hash: str, *, by: str | None = None, reason: str | None = None) -> Command:
    """The resume Command that approves the interrupted call whose args hash is ``args_hash``
    (a call with other arguments does not run)."""
    if not isinstance(args_hash, str) or not args_hash:
        raise TypeError("approve(args_hash): give the args_hash of the interrupt's value")
    return Command(resume=_decision(True, args_hash, by, reason))


def deny(reason: str | None = None, *, by: str | None = None) -> Command:
    """The resume Command that refuses the interrupted call: nothing runs, the model is told."""
    return Command(resume=_decision(False, None, by, reason))


def _decision(
    ok: bool, args_hash: str | None, by: str | None, reason: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"approve": ok}
    for k, v in (("args_hash", args_hash), ("by", by), ("reason", reason)):
        if v is not None:
            out[k] = v
    return out


def approval_requests(interrupts: Iterable[Any]) -> list[dict[str, Any]]:
    """The exactcall approval requests among a graph result's interrupts
    (``(await app.ainvoke(..., version="v2")).interrupts``), as plain dicts."""
    out = []
    for i in interrupts:
        value = getattr(i, "value", i)
        if isinstance(value, Mapping) and value.get("type") == APPROVAL_INTERRUPT:
            out.append(dict(value))
    return out


async def decide(interrupts: Iterable[Any]) -> Command:
    """Ask exactcall's approvals about each exactcall approval among a graph result's
    interrupts (``(await app.ainvoke(..., version="v2")).interrupts``), and return the
    Command that resumes them all (``await app.ainvoke(await decide(out.interrupts),
    config, version="v2")``). In the workflow.

    Each call waits as ``exactcall approvals list`` shows it (step ``TOOL@TOOL_CALL_ID``, its
    arguments and hash; LangGraph raises a node's interrupts one at a time, so a turn's calls
    are asked one after the other, and none of them runs before all are answered);
    ``exactcall approvals approve`` resumes it with :func:`approve` of that hash, ``deny``
    or the tool's ``approval_timeout`` with :func:`deny` and the reason the model then reads.
    Other interrupts are not answered: give them to the graph yourself (this raises if there
    are any, as a resume must answer all)."""
    pending = list(interrupts)
    ours = [i for i in pending if approval_requests([i])]
    others = [i for i in pending if i not in ours]
    if others:
        raise ExactcallError(
            f"exactcall.langgraph.decide: {len(others)} of the interrupts are not exactcall "
            "approvals; answer them with your own Command(resume={id: value, ...})"
        )

    async def one(i: Any) -> dict[str, Any]:
        value = i.value
        t = resolve_tool(value["tool"])
        try:
            grant = await ask_a_person(t, value["args"], value["tool_call_id"])
        except (ApprovalDenied, ApprovalExpired) as err:
            return _decision(False, None, None, f"{err.code}: {err.message}")
        by = ", ".join(grant.approved_by) or None
        return _decision(True, grant.args_hash, by, None)

    answers = await asyncio.gather(*(one(i) for i in ours))
    return Command(resume={i.id: a for i, a in zip(ours, answers, strict=True)})
