"""A session call's Temporal side: one workflow per call, whose one exactcall call runs it.

Its workflow id is ``session_call_id(session, step)`` (``exactcall-session-<session>/<step>``):
the same session and step are the same workflow whichever process asks, so a process that
starts again from the top attaches to the call an earlier one made (its recorded outcome, or
the call still going on: an approval it waits for, a reconciliation), and never starts a
second one. The call is ``exactcall.call_with`` at that step: the intent, the derived key
(``derive_key(namespace, <that workflow id>, step, tool, version)``), approvals, budgets and
unknown outcomes are exactcall's, as in any workflow. The run returns the outcome instead of
failing, so the workflow id keeps it (``REJECT_DUPLICATE``: never a second run).

Pure and deterministic: imported by workflows and by the calling process.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from temporalio import workflow

from exactcall._canonical import to_json_value
from exactcall._errors import ExactcallError
from exactcall._model import FROZEN
from exactcall._wire import SESSION_CALL_WORKFLOW
from exactcall.workflows._call import call_with
from exactcall.workflows._state import state

__all__ = ["CallInput", "Outcome", "SessionCall"]


class CallInput(BaseModel):
    """What a session call is, as its workflow receives it."""

    model_config = FROZEN

    session: str
    tool: str
    args: dict[str, Any]
    """The canonical arguments, by name."""
    args_hash: str
    step: str
    explicit_key: bool = False
    """The caller named the step (``key=``); else it is the tool's ordinal in the session."""
    on_unknown: Literal["wait", "raise"] | None = None


class Outcome(BaseModel):
    """How the call ended: its result, or the exactcall error it raised (by code)."""

    model_config = FROZEN

    args_hash: str
    step: str
    kind: Literal["done", "error"]
    result: Any = None
    code: str | None = None
    message: str | None = None
    fields: dict[str, Any] = {}


def ordinal(step: str) -> int:
    """``pay#3`` -> 3 (a session's own steps are always ``<tool>#<n>``)."""
    return int(step.rpartition("#")[2])


@workflow.defn(name=SESSION_CALL_WORKFLOW, sandboxed=False)  # pure code over exactcall's models
class SessionCall:
    """One call of an ``exactcall.session``, made once."""

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        key: str | None = inp.step
        if not inp.explicit_key:  # the step is the tool's ordinal, as in a workflow
            state().ordinals[inp.tool] = ordinal(inp.step) - 1
            key = None
        try:
            result = await call_with(inp.tool, kwargs=inp.args, key=key, on_unknown=inp.on_unknown)
        except ExactcallError as err:
            return Outcome(
                args_hash=inp.args_hash,
                step=inp.step,
                kind="error",
                code=err.code,
                message=err.message,
                fields=to_json_value(err.fields),
            )
        return Outcome(
            args_hash=inp.args_hash, step=inp.step, kind="done", result=to_json_value(result)
        )
