"""What exactcall's agent-framework adapters share, and what an adapter of your own needs.

``exactcall.openai_agents``, ``exactcall.pydantic_ai``, ``exactcall.langgraph``,
``exactcall.google_genai``, ``exactcall.google_adk`` and ``exactcall.strands`` are built on this
module and on exactcall's public API alone, so they follow one rule for each of these:

* **Which exactcall errors a model sees** (:data:`MODEL_ERRORS`). An error in it is a tool
  error the model can answer, and the run goes on. Any other exactcall error fails the run:

  - ``AmbiguousOutcome`` (an unknown outcome of an ``on_unknown="raise"`` tool): a model told
    "it failed" would call again, which is a new step with a new key, and may pay twice. The
    reconciliation goes on without the run, and ``exactcall unresolved`` lists the call.
  - ``ResultNotSerializable``: the tool ran, and a retry would run it again.
  - ``PluginNotInstalled`` and the like: a worker set up wrong. That must fail loudly, not
    reach a model.

  A framework that hands every ``Exception`` a tool raises to the model (Google Gen AI's
  automatic function calling, Strands) gets such an error past it with
  :func:`refusal_or_failure`: wrapped in :class:`FailTheRun` (a ``BaseException``), which the
  plugin's workflow interceptor unwraps where the run's code ends.

* **The schema a model sees** (:func:`schema_function`): the tool's signature without
  ``idempotency_key``, its resolved annotations, its name and docstring. Annotations that
  cannot be resolved are a ``TypeError`` when the adapter is built (a model given an untyped
  schema sends values the tool cannot take).
* **How a model's named arguments become a call** (:func:`split_arguments`): positional-only
  parameters by position, a ``**kwargs`` parameter sent as an object spread into it, and
  ``idempotency_key`` refused (exactcall derives it).
* **A person's answer to the framework's own approval** (:func:`ask_a_person`): an
  interruption of the framework's human-in-the-loop becomes a request in exactcall's
  approvals, bound to the call's hash: ``exactcall approvals list`` shows it and ``exactcall
  approvals approve`` (or ``deny``) answers it, like any exactcall approval.
* **Which step, so which key, a call has** (:func:`step_of`, :func:`planned_intent`): the
  tool's next ordinal in the run (``refund#1``, ``refund#2``), the path ``exactcall.call``
  takes without ``key=``; or, with a key function, the step the function names from the
  call's arguments, like ``exactcall.call(key=...)``. A model that calls ``refund(order=7,
  amount=10)`` twice then makes one refund: the second call gets the first one's result (the
  same arguments) or an ``IntentConflict`` (other arguments), never a second effect.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeAlias

from exactcall._errors import (
    ExactcallError,
    IntentConflict,
    InvalidCall,
    ToolFailed,
    register_error,
)
from exactcall._model import ApprovalGrant, Intent
from exactcall._tool import KEY_PARAM, Tool, resolve_tool
from exactcall.approvals._binding import ApprovalDenied, ApprovalExpired, ApprovalMissing
from exactcall.budgets._budget import BudgetExceeded
from exactcall.reconciliation._verdicts import CallAbandoned
from exactcall.undo._undo import UndoFailed
from exactcall.workflows._approval_wait import wait_for_approval
from exactcall.workflows._call import call_with, intent_of
from exactcall.workflows._state import FailTheRun, state

__all__ = [
    "KEY_PARAM",
    "MODEL_ERRORS",
    "FailTheRun",
    "KeyFunction",
    "KeyOption",
    "approval_step",
    "ask_a_person",
    "call_for_model",
    "key_functions",
    "next_step",
    "planned_intent",
    "refusal_or_failure",
    "register_error",
    "resolve_tool",
    "resolve_tools",
    "schema_function",
    "some_of",
    "split_arguments",
    "step_of",
]

MODEL_ERRORS: tuple[type[ExactcallError], ...] = (
    ApprovalDenied,  # a person said no: the model can tell the user, or ask for less
    ApprovalExpired,  # nobody decided in time: nothing ran
    ApprovalMissing,  # the call needs an approval it does not have: nothing ran
    IntentConflict,  # the step already ran with other arguments: nothing ran
    ToolFailed,  # a definite failure (it did not happen, or a re-run failed)
    CallAbandoned,  # a person gave up on an unknown outcome: the call will not be retried
    InvalidCall,  # arguments that do not fit the signature: nothing ran, the model can fix them
    BudgetExceeded,  # a budget declared on_exceed="refuse" would be passed: nothing ran
    UndoFailed,  # undos in a saga around the model's call failed (each is named)
)
"""The exactcall errors a model sees as tool errors (see the module's docstring)."""

KeyFunction: TypeAlias = Callable[[dict[str, Any]], str]
"""Names a call's step from its canonical arguments (a dict, defaults filled in), as
``exactcall.call(key=...)`` does: ``lambda args: f"order-{args['order_id']}"``. It runs in the
workflow, so it must be deterministic."""

KeyOption: TypeAlias = KeyFunction | Mapping[Tool | str, KeyFunction] | None
"""An adapter's ``key=``: one function for every tool, one per tool (by tool or name; the
others keep their ordinal steps), or None (ordinal steps for all)."""


# -- the schema --------------------------------------------------------------------------------
def schema_function(t: Tool) -> Callable[..., Any]:
    """A stand-in for the tool's function, never called, that a framework reads a schema from:
    the signature without ``idempotency_key``, resolved annotations, name and docstring."""
    try:
        hints = typing.get_type_hints(t.fn, include_extras=True)
    except Exception as exc:
        raise TypeError(
            f"exactcall tool {t.name!r}: the annotations of {t.fn.__qualname__} cannot be "
            f"resolved ({type(exc).__name__}: {exc}); a model needs them for the tool's schema. "
            "Import the names they use at module level (not under TYPE_CHECKING)"
        ) from exc
    params = [p.replace(annotation=hints.get(p.name, Any)) for p in t.params.values()]

    def stand_in(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - schema only
        raise ExactcallError(f"{t.name} runs through exactcall.call, not this stand-in")

    stand_in.__name__ = t.name
    stand_in.__qualname__ = t.name
    stand_in.__doc__ = inspect.getdoc(t.fn)
    stand_in.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        params, return_annotation=hints.get("return", inspect.Signature.empty)
    )
    stand_in.__annotations__ = {p.name: p.annotation for p in params}
    if "return" in hints:
        stand_in.__annotations__["return"] = hints["return"]
    return stand_in


# -- the arguments -----------------------------------------------------------------------------
def split_arguments(t: Tool, named: Any) -> tuple[list[Any], dict[str, Any]]:
    """A model's named arguments as ``exactcall.call_with``'s ``args`` and ``kwargs``
    (``InvalidCall``, which the model sees, if they are not an object or carry the key)."""
    if not isinstance(named, Mapping):
        raise InvalidCall(
            f"{t.name}: the arguments must be a JSON object, not {type(named).__name__}",
            tool=t.name,
        )
    kwargs = dict(named)
    if KEY_PARAM in kwargs and t.takes_key:
        raise InvalidCall(
            f"{t.name}: {KEY_PARAM} is derived by exactcall and cannot be sent", tool=t.name
        )
    args: list[Any] = []
    for name, p in t.params.items():
        if p.kind is p.POSITIONAL_ONLY and name in kwargs:
            args.append(kwargs.pop(name))
        elif p.kind is p.VAR_KEYWORD and isinstance(kwargs.get(name), Mapping):
            kwargs.update(kwargs.pop(name))
    return args, kwargs


# -- the tools -----------------------------------------------------------------------------------
def resolve_tools(tools: Collection[Tool | str], *, where: str) -> list[Tool]:
    """An adapter's tools (exactcall tools or their names), at least one, each once."""
    if not tools:
        raise TypeError(f"{where}() needs at least one exactcall tool")
    resolved = [resolve_tool(t) for t in tools]
    names = [t.name for t in resolved]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{where}(): {twice} listed twice")
    return resolved


def some_of(
    spec: bool | Collection[Tool | str], tools: Collection[Tool], *, option: str
) -> frozenset[str]:
    """The names an adapter's option such as ``requires_approval=`` picks: True for all of
    ``tools``, False for none, or a collection of some of them (by tool or name)."""
    names = {t.name for t in tools}
    if spec is True:
        return frozenset(names)
    if spec is False:
        return frozenset()
    if isinstance(spec, str) or not isinstance(spec, Collection):
        raise TypeError(f"{option}={spec!r}: use True, False, or a collection of these tools")
    chosen = frozenset(resolve_tool(t).name if isinstance(t, Tool) else str(t) for t in spec)
    unknown = sorted(chosen - names)
    if unknown:
        raise ValueError(f"{option} names {unknown}, which are not among {sorted(names)}")
    return chosen


# -- the step ----------------------------------------------------------------------------------
def key_functions(key: KeyOption, tools: Collection[Tool], *, where: str) -> dict[str, KeyFunction]:
    """An adapter's ``key=`` checked when the adapter is built: tool name -> key function.
    ``where`` names the adapter in the errors (``"exactcall.pydantic_ai.toolset"``)."""
    names = {t.name for t in tools}
    if key is None:
        return {}
    if callable(key):
        return dict.fromkeys(names, key)
    if not isinstance(key, Mapping):
        raise TypeError(
            f"{where}(key={key!r}): give a function of the call's arguments (lambda args: "
            "args['order_id']), a mapping of tool to such a function, or None"
        )
    out: dict[str, KeyFunction] = {}
    for tool, fn in key.items():
        name = resolve_tool(tool).name if isinstance(tool, Tool) else str(tool)
        if name not in names:
            raise ValueError(f"{where}(key=...): {name!r} is not one of its tools {sorted(names)}")
        if not callable(fn):
            raise TypeError(f"{where}(key=...): the key of {name!r} is {fn!r}, not a function")
        out[name] = fn
    return out


def next_step(t: Tool) -> str:
    """The tool's next ordinal step in this workflow run (``pay#1``, ``pay#2``), the step
    ``exactcall.call`` gives a call without ``key=``; taking it uses it up."""
    return state().next_step(t.name)


def step_of(t: Tool, named: Mapping[str, Any], key: KeyFunction | None) -> str | None:
    """The step ``key`` names for this call (None without a key function). In the workflow.
    A key function that raises or returns no usable step is ``InvalidCall``: nothing runs."""
    if key is None:
        return None
    args, kwargs = split_arguments(t, named)
    canonical = t.canonical_args(args, kwargs)
    try:
        step = key(dict(canonical))
    except Exception as exc:
        raise InvalidCall(
            f"{t.name}: its key function raised {type(exc).__name__}: {exc} for the arguments "
            f"{canonical}; nothing ran",
            tool=t.name,
        ) from None
    if not isinstance(step, str) or not step.strip():
        raise InvalidCall(
            f"{t.name}: its key function returned {step!r} for the arguments {canonical}; a "
            "step key is a non-empty string. Nothing ran",
            tool=t.name,
        )
    return step


def planned_intent(t: Tool, named: Mapping[str, Any], step: str | None = None) -> Intent:
    """The intent ``exactcall.call`` gives this call (tool, canonical args, hash, step, key),
    built by its own code. Without ``step`` it takes the tool's next ordinal. In the workflow."""
    args, kwargs = split_arguments(t, named)
    return intent_of(t, args, kwargs, step)


async def call_for_model(t: Tool, named: Mapping[str, Any], *, step: str | None = None) -> Any:
    """``exactcall.call_with`` of a model's tool call: its named arguments split, under
    ``step`` (from :func:`step_of`, or None for the tool's next ordinal)."""
    args, kwargs = split_arguments(t, named)
    return await call_with(t, args=args, kwargs=kwargs, key=step)


def refusal_or_failure(err: BaseException) -> BaseException:
    """For a framework that hands every ``Exception`` a tool raises to the model: ``err`` as
    it is when the model may see it (:data:`MODEL_ERRORS`), otherwise wrapped in
    :class:`FailTheRun`, which no ``except Exception`` catches and which fails the run with
    ``err`` itself (the plugin's workflow interceptor unwraps it)."""
    if isinstance(err, MODEL_ERRORS) or not isinstance(err, Exception):
        return err
    return FailTheRun(err)


# -- the framework's own approvals, in exactcall's ----------------------------------------------
def approval_step(t: Tool, call_id: str) -> str:
    """The step under which a framework's approval of call ``call_id`` is listed."""
    return f"{t.name}@{call_id}"


async def ask_a_person(t: Tool, named: Mapping[str, Any], call_id: str) -> ApprovalGrant:
    """Wait, in the workflow, for a person's decision on the framework's approval of the
    model's call ``call_id`` of ``t`` with these arguments: listed by ``exactcall approvals
    list`` (step ``TOOL@CALL_ID``, with the exact arguments and their hash), answered by
    ``exactcall approvals approve/deny``. Approved for exactly this hash: the grant (whose
    ``args_hash`` the framework's own approve then checks); denied or expired:
    ``ApprovalDenied`` / ``ApprovalExpired``, nothing runs. The tool's ``approvers``,
    ``min_approvals``, ``approval_timeout`` and signing rules apply."""
    intent = planned_intent(t, named, approval_step(t, call_id))
    return await wait_for_approval(t, intent)
