"""The proxy's Temporal side: one workflow per write call, whose one exactcall call forwards it.

The workflow id is the call's identity (server + tool + canonical arguments, or the
client's key); concurrent and repeated copies attach to it (update-with-start, conflict
policy USE_EXISTING) and each waits on the ``exactcall.mcp.wait`` update for the outcome.

* Without a client key the workflow stays open for ``window`` after the call settled, so
  every identical call in that time gets the recorded outcome; after it, the workflow has
  ended and the next identical call starts a new run, whose step (``tool@<start ms>``), and
  so whose derived key, is new. The window is measured from when the outcome was recorded.
* With a client key there is no window: the workflow ends when the call settles, and later
  copies read its result (a call that definitely did not happen fails the workflow instead,
  so the key is released and a retry runs it again).

An unknown outcome (the proxy or the server died during the call) is reported at once and
the workflow waits for the reconciliation's verdict (``exactcall resolve``); a call that needs
approval waits in exactcall's approval flow, bound to its args hash.

Pure and deterministic: imported by workflows and by the proxy.
"""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

import exactcall
from exactcall._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    PluginNotInstalled,
    ToolFailed,
)
from exactcall._verdicts import CallAbandoned, Settled
from exactcall._wire import MCP_PROXY_APPROVED_WORKFLOW as APPROVED_WORKFLOW
from exactcall._wire import MCP_PROXY_AWAIT_SETTLED as AWAIT_SETTLED
from exactcall._wire import MCP_PROXY_TOOL as PROXY_TOOL
from exactcall._wire import MCP_PROXY_WAIT_UPDATE as WAIT_UPDATE
from exactcall._wire import MCP_PROXY_WORKFLOW as WORKFLOW
from exactcall.workflows._state import state

__all__ = [
    "APPROVED_WORKFLOW",
    "AWAIT_SETTLED",
    "PROXY_TOOL",
    "WAIT_UPDATE",
    "WORKFLOW",
    "ApprovedProxyCall",
    "CallInput",
    "Outcome",
    "ProxyCall",
    "Wait",
    "bind_executor",
    "proxy_tool",
]


_FROZEN = ConfigDict(frozen=True, extra="forbid")
Kind = Literal["done", "failed", "unknown", "denied", "abandoned", "pending"]


class CallInput(BaseModel):
    """What a write call is, as the workflow that owns its identity receives it."""

    model_config = _FROZEN

    server: str
    tool: str
    arguments: dict[str, Any]
    extra: dict[str, Any] = {}
    """Other ``tools/call`` params (e.g. a multi-round-trip continuation), part of the identity."""
    args_hash: str
    step: str
    window_seconds: float | None
    """None: the identity is a client key (no window)."""
    caller: str
    """The request that started the workflow; other callers get ``deduplicated``."""


class Wait(BaseModel):
    """Argument of the wait update: who asks, for which call, and how long to hold."""

    model_config = _FROZEN

    caller: str
    args_hash: str
    timeout_seconds: float
    until_approval: bool = True
    """Also answer (``pending``, ``awaiting_approval``) as soon as the call waits for a person."""
    past_unknown: bool = False
    """Do not answer ``unknown``: wait for the verdict (while a re-run or a probe is going on)."""


class Outcome(BaseModel):
    """Where a write call is. ``result`` is the upstream's ``tools/call`` result (done)."""

    model_config = _FROZEN

    kind: Kind
    workflow_id: str
    step: str
    args_hash: str
    result: dict[str, Any] | None = None
    message: str | None = None
    deduplicated: bool = False
    awaiting_approval: bool = False
    released: bool = False
    """It definitely did not happen: the identity is free again."""
    reconcile_id: str | None = None
    """The reconciliation workflow of an unknown outcome."""


# -- the exactcall tool (runs in the proxy that holds the upstream session) -------------------
_EXECUTOR: dict[str, Any] = {}


def bind_executor(execute: Any) -> None:
    """Set the coroutine function ``(server, tool, arguments, extra, key) -> result`` that
    sends a call to this process's upstream server."""
    _EXECUTOR["execute"] = execute


def _approval_needed(intent: Any) -> bool:
    # pure on the intent (it also runs in the activity): the workflow type says it
    return bool(intent.workflow_type == APPROVED_WORKFLOW)


@exactcall.tool(
    name=PROXY_TOOL,
    approval=_approval_needed,
    heartbeat_timeout=timedelta(seconds=2),
    retry_policy=RetryPolicy(maximum_attempts=1),  # "did not happen" goes back to the client
)
async def proxy_tool(
    server: str,
    tool: str,
    arguments: dict[str, Any],
    extra: dict[str, Any],
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Send ``tools/call`` to the upstream MCP server, with the key in ``_meta``."""
    execute = _EXECUTOR.get("execute")
    if execute is None:
        raise exactcall.NotExecuted("this worker holds no MCP session (it is not a proxy)")
    result: dict[str, Any] = await execute(server, tool, arguments, extra, idempotency_key)
    return result


# -- the workflow ---------------------------------------------------------------------------
@workflow.defn(name=WORKFLOW)
class ProxyCall:
    """One write call of one MCP server, forwarded once."""

    @workflow.init
    def __init__(self, inp: CallInput) -> None:
        self._inp = inp
        self._outcome: Outcome | None = None

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        outcome = await self._call(inp)
        self._outcome = outcome
        if inp.window_seconds and not outcome.released:
            await workflow.sleep(timedelta(seconds=inp.window_seconds), summary="dedupe window")
        await workflow.wait_condition(workflow.all_handlers_finished)
        if outcome.released and inp.window_seconds is None:
            # fail the run so the client's key may be used again (reuse: failed runs only)
            raise ApplicationError(outcome.message or "not executed", type="NotExecuted")
        return outcome

    @workflow.update(name=WAIT_UPDATE)
    async def wait(self, w: Wait) -> Outcome:
        def answered() -> bool:
            o = self._outcome
            if o is not None:
                return o.kind != "unknown" or not w.past_unknown
            return w.until_approval and _awaiting_approval()

        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(answered, timeout=timedelta(seconds=w.timeout_seconds))
        current = self._outcome or self._make("pending", awaiting_approval=_awaiting_approval())
        return current.model_copy(update={"deduplicated": w.caller != self._inp.caller})

    @wait.validator
    def _same_call(self, w: Wait) -> None:
        if w.args_hash != self._inp.args_hash:
            raise IntentConflict(
                f"this identity already belongs to {self._inp.tool} with args hash "
                f"{self._inp.args_hash}; this call has {w.args_hash}. Nothing was executed.",
                recorded_hash=self._inp.args_hash,
                args_hash=w.args_hash,
            )

    async def _call(self, inp: CallInput) -> Outcome:
        kwargs = {
            "server": inp.server,
            "tool": inp.tool,
            "arguments": inp.arguments,
            "extra": inp.extra,
        }
        try:
            result = await exactcall.call_with(
                PROXY_TOOL, kwargs=kwargs, key=inp.step, on_unknown="raise"
            )
        except AmbiguousOutcome as err:
            return await self._reconciled(err)
        except (exactcall.ApprovalDenied, exactcall.ApprovalExpired) as err:
            return self._make("denied", message=err.message)
        except CallAbandoned as err:
            return self._make("abandoned", message=err.message)
        except (ToolFailed, InvalidCall) as err:  # it did not happen (or was refused first)
            return self._make("failed", message=err.message, released=True)
        except ExactcallError as err:
            return self._make("failed", message=f"{err.code}: {err.message}")
        if result.get("resultType") == "input_required":  # not a final answer: hold nothing
            return self._make("done", result=result, released=True)
        return self._make("done", result=result)

    async def _reconciled(self, err: AmbiguousOutcome) -> Outcome:
        """Report unknown now; wait for the verdict of ``exactcall resolve`` (or a probe)."""
        rid = str(err.fields.get("reconcile_id"))
        self._outcome = self._make("unknown", message=err.message, reconcile_id=rid)
        settled: Settled = await workflow.execute_activity(
            AWAIT_SETTLED,
            rid,
            result_type=Settled,
            start_to_close_timeout=timedelta(days=3650),
            heartbeat_timeout=timedelta(seconds=2),  # a proxy that went away: another takes it
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5)
            ),
        )
        by = f"decided by {settled.decided_by}"
        if settled.outcome == "done":
            return self._make("done", result=_as_result(settled.result, by), message=by)
        if settled.outcome == "abandoned":
            return self._make("abandoned", message=f"abandoned ({by}): {settled.reason}")
        return self._make("failed", message=f"re-run failed ({by}): {settled.reason}")

    def _make(self, kind: Kind, **fields: Any) -> Outcome:
        return Outcome(
            kind=kind,
            workflow_id=workflow.info().workflow_id,
            step=self._inp.step,
            args_hash=self._inp.args_hash,
            **fields,
        )


@workflow.defn(name=APPROVED_WORKFLOW)
class ApprovedProxyCall(ProxyCall):
    """The same, for a tool given to ``--approve``: the call waits for an exactcall approval."""

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        return await super().run(inp)


def _awaiting_approval() -> bool:
    try:
        book = state().book
    except PluginNotInstalled:  # an update that came with the start runs before the run does
        return False
    return bool(book.pending())


def _as_result(value: Any, by: str) -> dict[str, Any]:
    """The result of a call settled as landed: a re-run's result, or a person's ``--result
    JSON``, either a whole tools/call result (``{"content": [...]}``) or a JSON value, sent as
    text and as structured content (an object as it is, any other value as ``{"result": v}``,
    the MCP SDK's shape)."""
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return value
    result: dict[str, Any] = {"isError": False, "resultType": "complete"}
    if value is None:
        text = f"the call landed ({by}); no result was recorded"
    else:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        result["structuredContent"] = value if isinstance(value, dict) else {"result": value}
    return {"content": [{"type": "text", "text": text}], **result}
