"""The proxy's Temporal side: one workflow per write call, whose one exactcall call forwards it.

The workflow id is the call's identity (server + tool + canonical arguments, or the
client's key); concurrent and repeated copies attach to it (update-with-start, conflict
policy USE_EXISTING) and each waits on the ``exactcall.mcp.wait`` update for the outcome.
What an identical call gets depends on the run's ``mode`` (``CallInput.mode``):

* ``retry`` (the default): an identical call gets this call's outcome only while it is a
  retry: while the call runs, or while its final answer has reached no client (the request
  was cancelled, the client or the proxy went away), for up to ``hold_seconds``. A proxy that
  wrote the final answer to its client signals ``exactcall.mcp.delivered`` (with the time it
  queued it for the client), so the next identical call is a new call (a new run, a new step
  ``tool@<start ms>``, a new derived key) and runs. Copies whose clients sent them before
  that time are retries wherever they arrive from: the run lingers up to ``LINGER`` for
  those still on their way (another proxy's, slowed by load), and ends as soon as a copy
  sent after the delivery asks for a new run (``exactcall.mcp.next``).
* ``window`` (``--dedupe-window TOOL=10m``): the run stays open for ``window_seconds`` after
  the outcome, delivered or not, so every identical call in that time gets it.
* ``key`` (the client sent ``_meta`` ``io.exactcall/idempotency-key``): no window: the
  workflow ends when the call settles, and later copies read its result (a call that
  definitely did not happen fails the workflow instead, so the key is released and a retry
  runs it again).

A write in mode ``retry`` without approval runs as ``OwnedProxyCall``: the proxy starts the
run (conflict policy FAIL, its input the intent, started ``OWNER_DELAY`` later so no workflow
task is on the write's path), sends the call itself, and reports the outcome by signal once
its answer is written (``exactcall.mcp.owner-report``, with when it was delivered); the run
holds the identity for retries exactly as ``ProxyCall`` does. No report and no keepalive for
``OWNER_LEASE``: the outcome is unknown and the run starts its reconciliation.

A client that cancels its request signals ``exactcall.mcp.withdraw``; once every caller that
attached has withdrawn, the call is cancelled (exactcall's cancellation: nothing sent yet ->
released; sent -> the proxy forwards the cancel to the server and the outcome is what the
server answered, or unknown).

Runs started by an older proxy (no ``mode`` in their input) run as they always did: the
window for every call, or the client's key (tests/histories/mcp/proxy_call_window.json).

An unknown outcome (the proxy or the server died during the call) is reported at once and
the workflow waits for the reconciliation's verdict (``exactcall resolve``); a call that needs
approval waits in exactcall's approval flow, bound to its args hash.

Pure and deterministic: imported by workflows and by the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

import exactcall
from exactcall._canonical import derive_key
from exactcall._errors import (
    AmbiguousOutcome,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    PluginNotInstalled,
    ToolFailed,
)
from exactcall._model import FROZEN, Intent
from exactcall._wire import (
    MCP_PROXY_APPROVAL_SEEN,
    MCP_PROXY_APPROVED_WORKFLOW,
    MCP_PROXY_AWAIT_SETTLED,
    MCP_PROXY_DELIVERED_SIGNAL,
    MCP_PROXY_LINGERS,
    MCP_PROXY_NEXT_SIGNAL,
    MCP_PROXY_OWNED_WORKFLOW,
    MCP_PROXY_OWNER_ALIVE_SIGNAL,
    MCP_PROXY_OWNER_REPORT_SIGNAL,
    MCP_PROXY_OWNER_REPORT_UPDATE,
    MCP_PROXY_OWNER_WITHDRAW_UPDATE,
    MCP_PROXY_TOOL,
    MCP_PROXY_TOOL_VERSION,
    MCP_PROXY_WAIT_UPDATE,
    MCP_PROXY_WITHDRAW_SIGNAL,
    MCP_PROXY_WORKFLOW,
)
from exactcall.mcp._proxy_results import as_result
from exactcall.reconciliation._verdicts import CallAbandoned, Settled, reconcile_id
from exactcall.workflows._call import intent_of
from exactcall.workflows._state import state
from exactcall.workflows._unknown import start_reconciliation

__all__ = [
    "DELIVERED_AT",
    "LINGER",
    "MCP_PROXY_APPROVED_WORKFLOW",
    "MCP_PROXY_AWAIT_SETTLED",
    "MCP_PROXY_DELIVERED_SIGNAL",
    "MCP_PROXY_NEXT_SIGNAL",
    "MCP_PROXY_OWNED_WORKFLOW",
    "MCP_PROXY_OWNER_ALIVE_SIGNAL",
    "MCP_PROXY_OWNER_REPORT_SIGNAL",
    "MCP_PROXY_OWNER_REPORT_UPDATE",
    "MCP_PROXY_OWNER_WITHDRAW_UPDATE",
    "MCP_PROXY_TOOL",
    "MCP_PROXY_WAIT_UPDATE",
    "MCP_PROXY_WITHDRAW_SIGNAL",
    "MCP_PROXY_WORKFLOW",
    "OWNER_DELAY",
    "OWNER_LEASE",
    "ApprovedProxyCall",
    "CallInput",
    "Outcome",
    "OwnedProxyCall",
    "ProxyCall",
    "Report",
    "Wait",
    "bind_executor",
    "owned_key",
    "proxy_tool",
]


DELIVERED_AT = " delivered-at="
"""Between the caller and the time in the delivered signal's one argument."""
LINGER = timedelta(seconds=5)
"""How long a delivered run (mode ``retry``) waits for identical calls sent before its answer
was delivered: copies from other proxies still on their way (a new call ends it sooner)."""
OWNER_DELAY = timedelta(seconds=6)
"""An owned run's start delay: its first workflow task runs then (or as soon as an identical
call attaches), with the report that came meanwhile, so a write costs the proxy two RPCs and
no workflow task on its path; longer than ``LINGER``, so a delivered call's run ends in that
one task."""
OWNER_LEASE = timedelta(seconds=4)
"""How long an owned call waits for its proxy's report or keepalive (sent every second while
the server works on the call) before its outcome is unknown (the proxy was killed)."""
Kind = Literal["done", "failed", "unknown", "denied", "abandoned", "pending", "cancelled"]
Mode = Literal["retry", "window", "key"]
Repeat = Literal["running", "undelivered", "window", "key"]


class CallInput(BaseModel):
    """What a write call is, as the workflow that owns its identity receives it."""

    model_config = FROZEN

    server: str
    tool: str
    arguments: dict[str, Any]
    extra: dict[str, Any] = {}
    """Other ``tools/call`` params (e.g. a multi-round-trip continuation), part of the identity."""
    args_hash: str
    step: str
    window_seconds: float | None
    """Mode ``window``: how long identical calls get the outcome. In inputs of older proxies
    (no ``mode``): every call's window, None for a client key."""
    caller: str
    """The request that started the workflow; other callers get ``deduplicated``."""
    mode: Mode | None = None
    """What an identical call gets (see the module); None: an older proxy's input."""
    hold_seconds: float | None = None
    """Mode ``retry``: how long an outcome no client received waits for a retry."""


class Wait(BaseModel):
    """Argument of the wait update: who asks, for which call, and how long to hold."""

    model_config = FROZEN

    caller: str
    args_hash: str
    timeout_seconds: float
    until_approval: bool = True
    """Also answer (``pending``, ``awaiting_approval``) as soon as the call waits for a person."""
    past_unknown: bool = False
    """Do not answer ``unknown``: wait for the verdict (while a re-run or a probe is going on)."""
    sent_at: float | None = None
    """When the client's request reached its proxy (Unix time, the proxy's clock): a copy sent
    before the call's answer was delivered is a retry of it, even if it arrives later."""


class Outcome(BaseModel):
    """Where a write call is. ``result`` is the upstream's ``tools/call`` result (done)."""

    model_config = FROZEN

    kind: Kind
    workflow_id: str
    step: str
    args_hash: str
    result: dict[str, Any] | None = None
    message: str | None = None
    deduplicated: bool = False
    repeat: Repeat | None = None
    """Why a deduplicated caller got this outcome: it attached while the call ran, the
    answer had reached no client, the tool's dedupe window, or the client's key."""
    at: str | None = None
    """When the outcome was recorded (ISO 8601, UTC)."""
    window_seconds: float | None = None
    awaiting_approval: bool = False
    released: bool = False
    """It definitely did not happen: the identity is free again."""
    reconcile_id: str | None = None
    """The reconciliation workflow of an unknown outcome."""


class Report(BaseModel):
    """What an owned call did, from the proxy that sent it (``exactcall.mcp.owner-report``)."""

    model_config = FROZEN

    kind: Literal["done", "not_sent", "unknown"]
    """``done``: the server answered (``result``); ``not_sent``: it definitely did not reach
    the server; ``unknown``: it may or may not have run."""
    result: dict[str, Any] | None = None
    message: str | None = None
    withdrawn: bool = False
    """The owner's client cancelled the request (and no other caller waited)."""
    at: str | None = None
    """When the outcome was known (ISO 8601, UTC, the proxy's clock)."""
    delivered_at: float | None = None
    """The final answer was written to the owner's client, queued at this time (Unix time,
    the proxy's clock); None: it reached no client (cancelled, disconnected)."""
    delivered_after: float | None = None
    """How long after the run's start the answer was queued (seconds, the proxy's monotonic
    clock): the run lingers ``LINGER`` past it, on the server's clock, without comparing
    clocks."""


# -- the exactcall tool (runs in the proxy that holds the upstream session) -------------------
_EXECUTOR: dict[str, Any] = {}


def bind_executor(execute: Any) -> None:
    """Set the coroutine function ``(server, tool, arguments, extra, key) -> result`` that
    sends a call to this process's upstream server."""
    _EXECUTOR["execute"] = execute


def _approval_needed(intent: Any) -> bool:
    # pure on the intent (it also runs in the activity): the workflow type says it
    return bool(intent.workflow_type == MCP_PROXY_APPROVED_WORKFLOW)


@exactcall.tool(
    name=MCP_PROXY_TOOL,
    version=MCP_PROXY_TOOL_VERSION,
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
@workflow.defn(name=MCP_PROXY_WORKFLOW)
class ProxyCall:
    """One write call of one MCP server, forwarded once."""

    @workflow.init
    def __init__(self, inp: CallInput) -> None:
        self._inp = inp
        self._outcome: Outcome | None = None
        self._callers: set[str] = {inp.caller}
        self._while_running: set[str] = set()
        self._withdrawn: set[str] = set()
        self._delivered = False
        self._delivered_at: float | None = None
        self._next = False
        self._lingers = False
        self._closing = False
        self._task: asyncio.Task[Outcome] | None = None

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        mode = self._mode
        self._lingers = mode == "retry" and self._asks_lingers()  # before any await
        self._task = asyncio.ensure_future(self._call(inp))
        if self._withdrawn >= self._callers:  # withdrawn before the run began
            self._task.cancel()
        outcome = await self._task
        self._outcome = outcome
        if not outcome.released:
            if mode == "window" and inp.window_seconds:
                await workflow.sleep(timedelta(seconds=inp.window_seconds), summary="dedupe window")
            elif mode == "retry" and inp.hold_seconds:
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: self._delivered,
                        timeout=timedelta(seconds=inp.hold_seconds),
                        timeout_summary="kept for a retry",
                    )
                left = self._linger_left()
                if self._delivered and self._lingers and left > timedelta(0):
                    with contextlib.suppress(TimeoutError):
                        await workflow.wait_condition(
                            lambda: self._next,
                            timeout=left,
                            timeout_summary="copies sent before the answer was delivered",
                        )
        self._closing = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        if outcome.released and mode == "key":
            # fail the run so the client's key may be used again (reuse: failed runs only)
            raise ApplicationError(outcome.message or "not executed", type="NotExecuted")
        return outcome

    def _asks_lingers(self) -> bool:
        return workflow.patched(MCP_PROXY_LINGERS)

    def _linger_left(self) -> timedelta:
        return LINGER

    @property
    def _mode(self) -> Mode:
        """The run's mode; an older proxy's input (no ``mode``) has a window, or a key."""
        inp = self._inp
        return inp.mode or ("key" if inp.window_seconds is None else "window")

    @workflow.update(name=MCP_PROXY_WAIT_UPDATE)
    async def wait(self, w: Wait) -> Outcome:
        if w.caller not in self._callers:
            self._callers.add(w.caller)
            if self._outcome is None or self._delivered:  # delivered: sent while it ran
                self._while_running.add(w.caller)
        book = self._approval_book() if w.until_approval else None

        def answered() -> bool:
            o = self._outcome
            if o is not None:
                return o.kind != "unknown" or not w.past_unknown
            if book is not None:
                return bool(book.pending())
            return w.until_approval and _awaiting_approval()

        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(answered, timeout=timedelta(seconds=w.timeout_seconds))
        self._after_wait(w)
        current = self._outcome or self._make("pending", awaiting_approval=_awaiting_approval())
        if w.caller == self._inp.caller:
            return current.model_copy(update={"deduplicated": False})
        return current.model_copy(update={"deduplicated": True, "repeat": self._repeat(w.caller)})

    def _approval_book(self) -> Any:
        """The run's approval book, for a wait condition (None: it never asks a person). A
        condition is checked outside any task, where the run's state cannot be found."""
        return None

    def _after_wait(self, w: Wait) -> None:
        """(A caller sent after the delivery is refused by ``OwnedProxyCall``.)"""

    def _repeat(self, caller: str) -> Repeat:
        if caller in self._while_running:
            return "running"
        return "undelivered" if self._mode == "retry" else self._mode

    @wait.validator
    def _same_call(self, w: Wait) -> None:
        if w.args_hash != self._inp.args_hash:
            raise IntentConflict(
                f"this identity already belongs to {self._inp.tool} with args hash "
                f"{self._inp.args_hash}; this call has {w.args_hash}. Nothing was executed.",
                recorded_hash=self._inp.args_hash,
                args_hash=w.args_hash,
            )
        over = self._over()  # this run is over: the call is a new one
        new_caller = self._inp.mode is not None and w.caller not in self._callers
        if new_caller and over and not self._sent_before_delivery(w):
            raise ApplicationError("this call's answer was delivered", type="Delivered")

    def _over(self) -> bool:
        return self._delivered or self._closing

    def _sent_before_delivery(self, w: Wait) -> bool:
        """A copy its client sent before the first answer was delivered (while lingering)."""
        at = self._delivered_at
        return (
            self._lingers
            and not self._closing
            and at is not None
            and w.sent_at is not None
            and w.sent_at < at
        )

    @workflow.signal(name=MCP_PROXY_DELIVERED_SIGNAL)
    def delivered(self, caller: str) -> None:
        """A proxy wrote this call's final answer to its client; ``caller`` ends with
        ``DELIVERED_AT`` and when it was queued (its clock), from proxies that send it."""
        _, sep, when = caller.rpartition(DELIVERED_AT)
        at = float(when) if sep and when.replace(".", "", 1).isdigit() else None
        if self._outcome is not None and self._outcome.kind not in ("pending", "unknown"):
            self._delivered = True
            if at is not None and (self._delivered_at is None or at < self._delivered_at):
                self._delivered_at = at

    @workflow.signal(name=MCP_PROXY_NEXT_SIGNAL)
    def next_call(self) -> None:
        """An identical call sent after the answer was delivered waits for a new run."""
        if self._delivered:
            self._next = True

    @workflow.signal(name=MCP_PROXY_WITHDRAW_SIGNAL)
    def withdraw(self, caller: str) -> None:
        """A client cancelled its request; the call is cancelled once no caller waits."""
        self._withdrawn.add(caller)
        task = self._task
        if task is None or task.done() or self._outcome is not None:
            return
        if self._withdrawn >= self._callers:
            task.cancel()

    async def _call(self, inp: CallInput) -> Outcome:
        kwargs = {
            "server": inp.server,
            "tool": inp.tool,
            "arguments": inp.arguments,
            "extra": inp.extra,
        }
        try:
            result = await exactcall.call_with(
                MCP_PROXY_TOOL, kwargs=kwargs, key=inp.step, on_unknown="raise"
            )
        except asyncio.CancelledError:
            if inp.mode is None:
                raise
            return await self._after_cancel()
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
        return self._done(result)

    def _done(self, result: dict[str, Any], **fields: Any) -> Outcome:
        if result.get("resultType") == "input_required":  # not a final answer: hold nothing
            return self._make("done", result=result, released=True, **fields)
        return self._make("done", result=result, **fields)

    async def _after_cancel(self) -> Outcome:
        """Every caller withdrew: what the cancelled call did, from its flight's end."""
        flights = list(state().flights.values())
        task = flights[0].task if flights else None
        why = "the request was cancelled"
        if task is None or task.cancelled():
            return self._make("cancelled", message=f"{why} before it was sent", released=True)
        exc = task.exception()
        if exc is None:
            return self._done(task.result(), message=f"{why}; it had run")
        if isinstance(exc, AmbiguousOutcome):
            return await self._reconciled(exc)
        if isinstance(exc, ToolFailed | InvalidCall | exactcall.ApprovalDenied):
            text = exc.message if isinstance(exc, ExactcallError) else str(exc)
            return self._make("cancelled", message=f"{why}; it did not run ({text})", released=True)
        return self._make("failed", message=f"{why}: {type(exc).__name__}: {exc}")

    async def _reconciled(self, err: AmbiguousOutcome) -> Outcome:
        """Report unknown now; wait for the verdict of ``exactcall resolve`` (or a probe)."""
        rid = str(err.fields.get("reconcile_id"))
        self._outcome = self._make("unknown", message=err.message, reconcile_id=rid)
        settled: Settled = await workflow.execute_activity(
            MCP_PROXY_AWAIT_SETTLED,
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
            return self._make("done", result=as_result(settled.result, by), message=by)
        if settled.outcome == "abandoned":
            return self._make("abandoned", message=f"abandoned ({by}): {settled.reason}")
        if settled.error_type == "Cancelled" and self._inp.mode is not None:
            return self._make(
                "cancelled", message=f"cancelled, and it did not run ({by})", released=True
            )
        return self._make("failed", message=f"re-run failed ({by}): {settled.reason}")

    def _make(self, kind: Kind, **fields: Any) -> Outcome:
        if self._inp.mode is not None:
            fields.setdefault("at", workflow.now().isoformat(timespec="seconds"))
            fields.setdefault("window_seconds", self._inp.window_seconds)
        return Outcome(
            kind=kind,
            workflow_id=workflow.info().workflow_id,
            step=self._inp.step,
            args_hash=self._inp.args_hash,
            **fields,
        )


@workflow.defn(name=MCP_PROXY_APPROVED_WORKFLOW)
class ApprovedProxyCall(ProxyCall):
    """The same, for a tool given to ``--approve``: the call waits for an exactcall approval."""

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        return await super().run(inp)

    def _approval_book(self) -> Any:
        """Found here, in the update's task (runs from before the patch: None, as they ran)."""
        if workflow.patched(MCP_PROXY_APPROVAL_SEEN):
            with contextlib.suppress(PluginNotInstalled):
                return state().book
        return None


def _awaiting_approval() -> bool:
    try:
        book = state().book
    except PluginNotInstalled:  # an update that came with the start runs before the run does
        return False
    return bool(book.pending())


def owned_key(namespace: str, workflow_id: str, step: str) -> str:
    """The idempotency key of an owned call: the key exactcall derives for the proxy tool's
    call at that step (so a reconciliation's re-run sends the same one)."""
    return derive_key(namespace, workflow_id, step, proxy_tool.name, proxy_tool.version)


@workflow.defn(name=MCP_PROXY_OWNED_WORKFLOW)
class OwnedProxyCall(ProxyCall):
    """A write call (mode ``retry``, no approval) that the proxy which started the run sends
    to its server itself, without an activity: the run's start (its input, conflict policy
    FAIL) is the recorded intent, and the proxy reports the outcome by signal before it
    answers its client. Identical calls attach and wait as on ``ProxyCall``. A proxy that goes
    quiet (no report, no keepalive for ``OWNER_LEASE``) leaves the outcome unknown: the run
    starts the call's reconciliation (a person decides; "not landed" re-runs it through the
    proxy tool, with the same key), and never sends it again by itself."""

    @workflow.init
    def __init__(self, inp: CallInput) -> None:
        super().__init__(inp)
        self._report: Report | None = None
        self._linger_until: datetime | None = None
        self._alive = 0
        self._owner_withdrawn = False
        # an identical call can come in the run's first task, before the run begins (its
        # start is delayed): a delivered run lingers for copies sent before the delivery
        self._lingers = inp.mode == "retry"

    def _asks_lingers(self) -> bool:
        return True  # always, on this workflow type (it came after the patch)

    @workflow.run
    async def run(self, inp: CallInput) -> Outcome:
        return await super().run(inp)

    @workflow.signal(name=MCP_PROXY_OWNER_REPORT_SIGNAL)
    def owner_report(self, report: Report) -> None:
        """What the call did; a final outcome is this run's outcome at once (so an identical
        call that comes in the same workflow task sees it, and whether it was delivered)."""
        if self._report is not None:
            return
        self._report = report
        if report.kind != "unknown":
            self._outcome = self._reported(report)
            if report.delivered_at is not None and not self._outcome.released:
                self._delivered = True
                self._delivered_at = report.delivered_at
                after = timedelta(seconds=report.delivered_after or 0.0)
                self._linger_until = workflow.info().workflow_start_time + after + LINGER

    def _after_wait(self, w: Wait) -> None:
        """A copy that attached before the report came, but that its client sent after this
        call's answer was delivered, is a new call: refused, so its proxy starts a new run."""
        at, sent = self._delivered_at, w.sent_at
        if w.caller != self._inp.caller and at is not None and sent is not None and sent > at:
            self._callers.discard(w.caller)
            self._while_running.discard(w.caller)
            raise ApplicationError("this call's answer was delivered", type="Delivered")

    def _linger_left(self) -> timedelta:
        """The linger counts from the delivery: a run whose first task comes later (its start
        delay) ends at once, in that one task."""
        until = self._linger_until
        return LINGER if until is None else until - workflow.now()

    @workflow.update(name=MCP_PROXY_OWNER_REPORT_UPDATE)
    async def owner_report_now(self, report: Report) -> bool:
        """The same report, for an outcome the owner answers only once this run has acted on
        it (unknown: its reconciliation has started, so ``exactcall unresolved`` lists it)."""
        self.owner_report(report)
        await workflow.wait_condition(lambda: self._outcome is not None)
        return True

    def _over(self) -> bool:
        # a call that definitely did not happen holds nothing: an identical call is a new one
        released = self._outcome is not None and self._outcome.released
        return released or super()._over()

    @workflow.signal(name=MCP_PROXY_OWNER_ALIVE_SIGNAL)
    def owner_alive(self) -> None:
        self._alive += 1

    @workflow.update(name=MCP_PROXY_OWNER_WITHDRAW_UPDATE)
    def owner_withdraw(self) -> bool:
        """The owner's client cancelled: True when no other caller waits (it may cancel)."""
        self._owner_withdrawn = True
        others = self._callers - {self._inp.caller}
        return self._outcome is None and others <= self._withdrawn

    @workflow.signal(name=MCP_PROXY_WITHDRAW_SIGNAL)
    def withdraw(self, caller: str) -> None:
        """Another proxy's caller cancelled; the owner cancels only what no one waits for."""
        self._withdrawn.add(caller)

    def _reported_or_alive_since(self, seen: int) -> bool:
        """The owner reported, or sent a keepalive after the ``seen``-th."""
        return self._report is not None or self._alive != seen

    async def _call(self, inp: CallInput) -> Outcome:
        seen = -1
        while self._report is None and seen != self._alive:
            seen = self._alive
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    partial(self._reported_or_alive_since, seen),
                    timeout=OWNER_LEASE,
                    timeout_summary="the sending proxy's report",
                )
        r = self._report
        if r is None:
            return await self._unknown(
                "the proxy that sent it went quiet before it reported the outcome (it was "
                "killed, or lost Temporal)",
                cancelled=False,
            )
        if r.kind == "unknown":
            return await self._unknown(r.message or "the call was cut off", cancelled=r.withdrawn)
        return self._outcome or self._reported(r)

    def _reported(self, r: Report) -> Outcome:
        at = {"at": r.at} if r.at else {}
        why = "the request was cancelled"
        if r.kind == "done":
            if r.withdrawn:
                return self._done(r.result or {}, message=f"{why}; it had run", **at)
            return self._done(r.result or {}, **at)
        if r.withdrawn:
            return self._make("cancelled", message=f"{why} before it was sent", released=True, **at)
        return self._make("failed", message=r.message, released=True, **at)

    async def _unknown(self, reason: str, *, cancelled: bool) -> Outcome:
        intent = self._intent()
        rid = reconcile_id(intent.key)
        err = AmbiguousOutcome(reason, reason=reason, reconcile_id=rid)
        await start_reconciliation(proxy_tool, intent, err, cancelled=cancelled)
        return await self._reconciled(err)

    def _intent(self) -> Intent:
        """The intent exactcall would have recorded for the proxy tool's call at this step
        (its key is the one the proxy sent)."""
        inp = self._inp
        kwargs = {
            "server": inp.server,
            "tool": inp.tool,
            "arguments": inp.arguments,
            "extra": inp.extra,
        }
        return intent_of(proxy_tool, (), kwargs, inp.step)
