"""exactcall for Pydantic AI agents on Temporal (``pip install 'exactcall[pydantic-ai]'``).

``toolset(*tools)`` is what goes on ``Agent(toolsets=[...])``: every call the model makes to one
of its tools runs through ``exactcall.call`` in the workflow (a persisted intent, a derived key,
no blind re-run), never through Pydantic AI's toolset activity. Nothing else is needed besides
Pydantic AI's own ``TemporalDurability`` capability and ``PydanticAIPlugin``::

    agent = Agent(model, name="payer", toolsets=[exactcall.pydantic_ai.toolset(pay)],
                  capabilities=[TemporalDurability()])

The model sees each tool's signature (minus ``idempotency_key``) and docstring. Steps are
exactcall's ordinals (``pay#1``, ``pay#2``): Pydantic AI never re-runs a tool call that returned,
so they are stable under replay, crashes, a retried model turn and a resume; neither the
``RunContext`` nor its ``run_id`` (which holds the Temporal run id) enters a key or a hash.

Pydantic AI's deferred approvals are bound to the argument hash: a tool named in
``requires_approval`` ends the run with ``DeferredToolRequests`` whose ``metadata[tool_call_id]``
carries the call's ``exactcall_args_hash``; ``approve(requests, tool_call_id, args_hash=...)``
builds the ``DeferredToolResults`` that resumes it. Where the tool runs, an approval is honoured
only if its hash is the hash of the arguments about to run (``override_args`` included); a plain
``True`` carries no hash and releases nothing.

``toolset(..., key=lambda args: f"order-{args['order_id']}")`` names a call's step from its
arguments instead (see :mod:`exactcall.adapters`): a model that repeats the call repeats no
effect.

exactcall's refusals (a denied, expired or mismatched approval, a conflict, a definite failure,
an abandoned call: :data:`exactcall.adapters.MODEL_ERRORS`) reach the model as a failed tool
result (Pydantic AI's ``ToolFailed``): the run goes on and the model reads why. An unknown
outcome of an ``on_unknown="raise"`` tool fails the run instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from exactcall._wire import PYDANTIC_AI_ARGS_HASH as ARGS_HASH

try:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
    from pydantic_ai import Tool as PaiTool
    from pydantic_ai.exceptions import ApprovalRequired, ModelRetry
    from pydantic_ai.exceptions import ToolFailed as PaiToolFailed
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "exactcall.pydantic_ai needs Pydantic AI with its Temporal extra: "
        "pip install 'exactcall[pydantic-ai]'"
    ) from exc

from exactcall import ApprovalDenied, ApprovalExpired, InvalidCall, Tool, args_hash
from exactcall.integrations._adapters import (
    MODEL_ERRORS,
    KeyOption,
    ask_a_person,
    call_for_model,
    key_functions,
    resolve_tool,
    schema_function,
    split_arguments,
    step_of,
)

__all__ = ["ARGS_HASH", "ExactcallToolset", "approve", "decide", "toolset"]


_REFUSALS = tuple(e for e in MODEL_ERRORS if e is not InvalidCall)
"""Tool errors (see exactcall.adapters); InvalidCall is a ModelRetry instead."""


def toolset(
    *tools: Tool | str,
    id: str | None = None,
    requires_approval: bool | Collection[Tool | str] = False,
    max_retries: int = 1,
    key: KeyOption = None,
) -> ExactcallToolset:
    """The toolset to put on ``Agent(toolsets=[...])``: each tool call runs through exactcall.

    ``tools``: exactcall tools (``@exactcall.tool``) or their names. ``requires_approval``:
    True for all of them, or the tools whose calls end the run with ``DeferredToolRequests``
    until approved with :func:`approve` (Pydantic AI's human-in-the-loop flow; a tool declared
    ``@exactcall.tool(approval=True)`` instead waits inside the run for exactcall's signal).
    ``max_retries``: how often the model may retry a call whose arguments do not fit.
    ``key``: a function of a call's arguments that names its step (``lambda args:
    f"order-{args['order_id']}"``), or a mapping of tool to such a function: a model that
    repeats a call repeats no effect (the same arguments get the first call's result, others
    an ``IntentConflict``). Without it each call is a new step (``refund#1``, ``refund#2``).
    """
    return ExactcallToolset(
        tools, id=id, requires_approval=requires_approval, max_retries=max_retries, key=key
    )


class ExactcallToolset(AbstractToolset[Any]):
    """A Pydantic AI toolset of exactcall tools; build it with :func:`toolset`.

    It is not a ``FunctionToolset``, so ``TemporalDurability`` leaves it as it is: listing and
    calling its tools happen in the workflow, and each call is ``exactcall.call``'s own tool
    activity (intent first, key derived, attempts settled) instead of a toolset activity.
    """

    def __init__(
        self,
        tools: Sequence[Tool | str],
        *,
        id: str | None = None,
        requires_approval: bool | Collection[Tool | str] = False,
        max_retries: int = 1,
        key: KeyOption = None,
    ) -> None:
        if not tools:
            raise TypeError("exactcall.pydantic_ai.toolset() needs at least one exactcall tool")
        resolved = [resolve_tool(t) for t in tools]
        self._tools: dict[str, Tool] = {}
        for t in resolved:
            if t.name in self._tools:
                raise ValueError(f"exactcall.pydantic_ai.toolset(): {t.name!r} is listed twice")
            self._tools[t.name] = t
        self._id = id
        self._max_retries = max_retries
        self._approval = _approval_names(requires_approval, self._tools)
        self._keys = key_functions(key, resolved, where="exactcall.pydantic_ai.toolset")
        self._defs = {name: _definition(t, max_retries) for name, t in self._tools.items()}

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def tools(self) -> list[Tool]:
        """The exactcall tools of this toolset."""
        return list(self._tools.values())

    def requires_approval(self, name: str) -> bool:
        """Whether calls of ``name`` wait for a Pydantic AI deferred approval."""
        return name in self._approval

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=pai.tool_def,
                max_retries=self._max_retries,
                args_validator=pai.function_schema.validator,
            )
            for name, pai in self._defs.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        t = self._tools.get(name) or self._tools[tool.tool_def.name]
        if ctx.tool_call_approved:
            check_approval(t, tool_args, ctx.tool_call_metadata)
        elif t.name in self._approval:
            raise ApprovalRequired(metadata=request_metadata(t, tool_args))
        try:
            step = step_of(t, tool_args, self._keys.get(t.name))
            return await call_for_model(t, tool_args, step=step)
        except _REFUSALS as err:
            raise PaiToolFailed(f"{err.code}: {err.message}") from err
        except InvalidCall as err:
            raise ModelRetry(f"{err.code}: {err.message}") from err


def approve(
    requests: DeferredToolRequests,
    tool_call_id: str,
    *,
    args_hash: str,
    override_args: Mapping[str, Any] | None = None,
    results: DeferredToolResults | None = None,
) -> DeferredToolResults:
    """Approve one call of ``requests`` for exactly the arguments whose hash is ``args_hash``.

    Without ``override_args`` the hash must be the requested call's
    (``requests.metadata[tool_call_id]["exactcall_args_hash"]``), or this raises ValueError and
    approves nothing. With ``override_args`` it must be the hash of the overridden arguments
    (``exactcall.intent_hash(tool, **override_args)``); the tool checks it where it runs and
    refuses the call if it is not. ``results``: add to these results (returned) instead of new
    ones.
    """
    call = next((c for c in requests.approvals if c.tool_call_id == tool_call_id), None)
    if call is None:
        pending = ", ".join(repr(c.tool_call_id) for c in requests.approvals) or "none"
        raise ValueError(
            f"no call with tool_call_id {tool_call_id!r} waits for approval (pending: {pending})"
        )
    requested = (requests.metadata.get(tool_call_id) or {}).get(ARGS_HASH)
    if requested is None:
        raise ValueError(
            f"{call.tool_name} ({tool_call_id}) carries no exactcall_args_hash: it is not a call "
            "of an exactcall.pydantic_ai.toolset(..., requires_approval=...) tool (a wrapper such "
            "as .approval_required() asks without the hash); approve it the Pydantic AI way"
        )
    _check_hash_format(args_hash)
    if override_args is None and args_hash != requested:
        raise ValueError(
            f"args_hash {args_hash} is not the hash of the requested call {call.tool_name} "
            f"({tool_call_id}), which is {requested}: approve the call you reviewed. "
            "Nothing was approved"
        )
    out = results if results is not None else DeferredToolResults()
    approved = dict(override_args) if override_args is not None else None
    out.approvals[tool_call_id] = ToolApproved(override_args=approved)
    out.metadata[tool_call_id] = {**out.metadata.get(tool_call_id, {}), ARGS_HASH: args_hash}
    return out


async def decide(
    requests: DeferredToolRequests, results: DeferredToolResults | None = None
) -> DeferredToolResults:
    """Ask exactcall's approvals about each deferred call of an exactcall toolset in
    ``requests``, and return the results that resume the run
    (``agent.run(message_history=..., deferred_tool_results=...)``). In the workflow.

    Each call waits, all at once, as ``exactcall approvals list`` shows it (step
    ``TOOL@TOOL_CALL_ID``, its arguments and hash); ``exactcall approvals approve`` approves
    it through :func:`approve` (bound to the hash); ``deny`` or the tool's
    ``approval_timeout`` answers ``ToolDenied`` with the reason the model then reads. Calls
    without exactcall's metadata (another toolset's) are left out of the results, for the
    workflow to decide."""
    out = results if results is not None else DeferredToolResults()

    async def one(call: Any, meta: Mapping[str, Any]) -> None:
        t = resolve_tool(meta["exactcall_tool"])
        try:
            await ask_a_person(t, meta["exactcall_args"], call.tool_call_id)
        except (ApprovalDenied, ApprovalExpired) as err:
            out.approvals[call.tool_call_id] = ToolDenied(f"{err.code}: {err.message}")
            return
        # approved for exactly this call (the book took its hash, or the same call's hash
        # under an older signature: Tool.same_call); the request's own hash releases it
        approve(requests, call.tool_call_id, args_hash=meta[ARGS_HASH], results=out)

    asked = []
    for call in requests.approvals:
        meta = requests.metadata.get(call.tool_call_id) or {}
        if ARGS_HASH in meta and "exactcall_tool" in meta:
            asked.append(one(call, meta))
    await asyncio.gather(*asked)
    return out


def request_metadata(t: Tool, tool_args: Mapping[str, Any]) -> dict[str, Any]:
    """What a deferred approval request of ``t`` carries: tool, canonical args and their hash."""
    canonical = _canonical(t, tool_args)
    return {
        "exactcall_tool": t.name,
        "exactcall_args": canonical,
        ARGS_HASH: args_hash(t.name, canonical),
    }


def check_approval(t: Tool, tool_args: Mapping[str, Any], metadata: Any) -> None:
    """Refuse (Pydantic AI ``ToolFailed``) an approval that is not for exactly these arguments."""
    granted = metadata.get(ARGS_HASH) if isinstance(metadata, Mapping) else None
    if granted is None:
        raise PaiToolFailed(
            f"ApprovalMissing: the approval of {t.name} carries no exactcall args hash (a plain "
            "True releases nothing for an exactcall tool); approve with "
            "exactcall.pydantic_ai.approve(requests, tool_call_id, args_hash=...). Nothing ran"
        )
    canonical = _canonical(t, tool_args)
    actual = args_hash(t.name, canonical)
    if not t.same_call(granted, canonical):
        raise PaiToolFailed(
            f"ApprovalMissing: the approval of {t.name} is for args hash {granted}, but the "
            f"arguments about to run hash to {actual} (override_args change the hash: approve "
            "with the hash of the overridden arguments). Nothing ran"
        )


def _canonical(t: Tool, tool_args: Mapping[str, Any]) -> dict[str, Any]:
    try:
        args, kwargs = split_arguments(t, tool_args)
        return t.canonical_args(args, kwargs)
    except InvalidCall as err:
        raise ModelRetry(f"{err.code}: {err.message}") from err


def _check_hash_format(value: Any) -> None:
    if not (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    ):
        raise ValueError(
            f"args_hash={value!r}: an exactcall args hash is 64 lowercase hex characters "
            "(the request's metadata exactcall_args_hash, or exactcall.intent_hash(...))"
        )


def _approval_names(
    spec: bool | Collection[Tool | str], tools: Mapping[str, Tool]
) -> frozenset[str]:
    if spec is True:
        return frozenset(tools)
    if spec is False:
        return frozenset()
    if isinstance(spec, str) or not isinstance(spec, Collection):
        raise TypeError(
            f"requires_approval={spec!r}: use True, False, or a collection of this toolset's tools"
        )
    names = frozenset(resolve_tool(t).name if isinstance(t, Tool) else str(t) for t in spec)
    unknown = sorted(names - set(tools))
    if unknown:
        raise ValueError(
            f"requires_approval names {unknown}, which are not in this toolset ({sorted(tools)})"
        )
    return names


def _definition(t: Tool, max_retries: int) -> PaiTool[Any]:
    """A Pydantic AI tool definition from the exactcall tool's signature and docstring."""
    return PaiTool(
        schema_function(t),
        takes_ctx=False,
        name=t.name,
        max_retries=max_retries,
    )
