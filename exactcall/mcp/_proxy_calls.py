"""A write call the proxy took over: its identity, its workflow, the wait, the answer.

Identity (documented formulas):

* ``args_hash = exactcall.intent_hash("exactcall.mcp_proxy", server=NAME, tool=TOOL,
  arguments=ARGS, extra=OTHER_PARAMS)``: the hash approvals are bound to;
* without a client key, workflow id ``exactcall-mcp-<NAME>-<args_hash[:32]>`` (identical calls
  share it while they are retries of one call, see :mod:`._proxy_workflow`, or for the tool's
  ``--dedupe-window``), step ``<tool>@<epoch ms of the run's first call>``;
* with ``_meta`` ``io.exactcall/idempotency-key`` = K, workflow id
  ``exactcall-mcp-<NAME>-key-<sha256(K)[:32]>``, step ``<tool>``; K reused with other
  arguments is refused (IntentConflict) before anything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

import exactcall
from exactcall._errors import ArgumentsTooLarge, IntentConflict
from exactcall.mcp._meta import DEDUPLICATED_META
from exactcall.mcp._meta import KEY_META as CLIENT_KEY_META
from exactcall.mcp._proxy_policy import duration_text
from exactcall.mcp._proxy_results import clock as _clock
from exactcall.mcp._proxy_results import tool_error
from exactcall.mcp._proxy_workflow import (
    DELIVERED_AT,
    MCP_PROXY_APPROVED_WORKFLOW,
    MCP_PROXY_DELIVERED_SIGNAL,
    MCP_PROXY_NEXT_SIGNAL,
    MCP_PROXY_OWNED_WORKFLOW,
    MCP_PROXY_OWNER_ALIVE_SIGNAL,
    MCP_PROXY_OWNER_REPORT_SIGNAL,
    MCP_PROXY_OWNER_REPORT_UPDATE,
    MCP_PROXY_OWNER_WITHDRAW_UPDATE,
    MCP_PROXY_WAIT_UPDATE,
    MCP_PROXY_WITHDRAW_SIGNAL,
    MCP_PROXY_WORKFLOW,
    OWNER_DELAY,
    CallInput,
    Mode,
    Outcome,
    Report,
    Wait,
    owned_key,
    proxy_tool,
)
from exactcall.reconciliation import state as reconciliation_state
from exactcall.reconciliation._verdicts import reconcile_id

__all__ = ["Call", "Caller", "Reply", "identity", "tool_error"]

log = structlog.get_logger("exactcall")
MAX_CLIENT_KEY = 200
WAIT_SLICE = 30.0
SHORT_SLICE = 2.0
MAX_KEPT_METAS = 1000
NEW_RUN_TRIES = 100
"""Attempts to start a new run while the previous identical call's run is ending."""
KEEPALIVE = 1.0
"""How often the proxy sending an owned call tells its run that it still waits (seconds)."""
REPORT_WAIT = 2.0
"""How long an owned call's report waits to say whether its answer was written (seconds)."""
REPORT_TRIES = 20
REPORT_RPC_TIMEOUT = 2.0
Delivery = tuple[float, float]
"""When an answer was queued for the client: Unix time, and ``time.monotonic()``."""
Send = Callable[[str, str, dict[str, Any], dict[str, Any], str], Awaitable[dict[str, Any]]]
"""``send(workflow_id, tool, arguments, extra, key)``: the call to this proxy's server."""
FINAL = frozenset({"done", "failed", "denied", "abandoned", "cancelled"})


@dataclass
class Call:
    """One intercepted ``tools/call``."""

    request_id: Any
    tool: str
    arguments: dict[str, Any]
    extra: dict[str, Any]
    meta: dict[str, Any]
    approval: bool
    window: timedelta | None = None
    """The tool's ``--dedupe-window``: identical calls within it get this call's outcome."""
    caller: str = field(default_factory=lambda: uuid.uuid4().hex)
    workflow_id: str | None = None
    """Set once the call's workflow has it as a caller (its withdrawal can be sent)."""
    cancelled: bool = False
    """The client cancelled the request: it gets no response (MCP)."""
    origin: Any = field(default=None, compare=False, repr=False)
    """The client session it came from (its progress goes there, and it is sent upstream
    through that session's server while the session is open)."""
    started: float = field(default_factory=time.monotonic, compare=False, repr=False)
    """When it reached the proxy: the approval wait counts from then."""

    @property
    def client_key(self) -> Any:
        return self.meta.get(CLIENT_KEY_META)

    @property
    def progress_token(self) -> Any:
        return self.meta.get("progressToken")


@dataclass(frozen=True)
class Reply:
    """The JSON-RPC ``result`` for the client, and the audit outcome."""

    result: dict[str, Any]
    outcome: str
    args_hash: str | None = None
    workflow_id: str | None = None
    step: str | None = None
    deliver: str | None = None
    """The caller id to report delivered once the result is written (a final outcome whose
    run is kept for a retry until a client got it)."""
    settled: bool = False
    """Its result comes from a verdict on an unknown outcome (a person's value, or a re-run)."""


@dataclass(frozen=True)
class Identity:
    """What makes two calls the same call."""

    args_hash: str
    workflow_id: str
    keyed: bool
    """The client's key is the identity (no window)."""

    @property
    def reuse(self) -> WorkflowIDReusePolicy:
        # a keyed call's run that failed (it did not happen) frees the key for a retry
        if self.keyed:
            return WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
        return WorkflowIDReusePolicy.ALLOW_DUPLICATE

    def step(self, tool: str) -> str:
        return tool[:100] if self.keyed else f"{tool[:100]}@{int(time.time() * 1000)}"


def identity(server: str, call: Call) -> Identity:
    """The identity of a call (InvalidCall for arguments or a key exactcall refuses)."""
    h = exactcall.intent_hash(
        proxy_tool, server=server, tool=call.tool, arguments=call.arguments, extra=call.extra
    )
    key = call.client_key
    if key is None:
        return Identity(h, f"exactcall-mcp-{server}-{h[:32]}", keyed=False)
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_CLIENT_KEY:
        raise exactcall.InvalidCall(
            f"_meta {CLIENT_KEY_META} must be a non-empty string of at most {MAX_CLIENT_KEY} "
            f"characters; got {key!r}."
        )
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return Identity(h, f"exactcall-mcp-{server}-key-{digest}", keyed=True)


class Caller:
    """Runs intercepted calls on Temporal and turns their outcomes into MCP results."""

    def __init__(
        self,
        server: str,
        retry_window: timedelta,
        approval_wait: timedelta,
        task_queue: str,
        cli_flags: Any,
        progress: Any,
        resolve_flags: Any = None,
    ) -> None:
        """``retry_window``: how long an outcome no client received waits for a retry;
        ``cli_flags()``: connection flags for printed commands; ``progress(call, n,
        message)``: sends a progress notification to the call's client. ``metas``: the
        client's ``_meta`` of each call by workflow id, for the upstream request (not
        identity); ``origins``: the client session each call came from."""
        self.server = server
        self.retry_window = retry_window.total_seconds()
        self.approval_wait = approval_wait.total_seconds()
        self.task_queue = task_queue
        self._cli_flags = cli_flags
        self._resolve_flags = resolve_flags or cli_flags
        self._progress = progress
        self.metas: dict[str, dict[str, Any]] = {}
        self.origins: dict[str, Any] = {}
        self._delivering: dict[str, asyncio.Future[None]] = {}
        self.send: Send | None = None
        self.get_client: Callable[[], Awaitable[Client]] = _no_client
        """Set by a proxy that sends its own calls (owned runs); None: every call goes
        through the proxy tool's activity."""
        self._owned: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._answered: dict[str, asyncio.Future[Delivery | None]] = {}
        """Owned calls whose report waits for the answer's delivery, by workflow id."""
        self._late: set[asyncio.Future[Any]] = set()

    async def run(self, client: Client, call: Call) -> Reply:
        try:
            ident = identity(self.server, call)
        except ArgumentsTooLarge as err:
            text = (
                f"{self.server}.{call.tool}: its canonical arguments are {err.fields['size']} "
                f"bytes, over this proxy's limit of {err.fields['limit']} bytes; nothing was "
                "sent. Pass a reference (a path, an id, a URL) instead, or start the proxy "
                "with a larger --max-args-bytes (e.g. --max-args-bytes 1MiB)."
            )
            return Reply(tool_error(text, "denied"), "denied")
        except exactcall.InvalidCall as err:
            return Reply(tool_error(f"{err.message} Nothing was sent.", "denied"), "denied")
        mode: Mode = "key" if ident.keyed else ("window" if call.window else "retry")
        inp = CallInput(
            server=self.server,
            tool=call.tool,
            arguments=call.arguments,
            extra=call.extra,
            args_hash=ident.args_hash,
            step=ident.step(call.tool),
            window_seconds=call.window.total_seconds() if call.window else None,
            caller=call.caller,
            mode=mode,
            hold_seconds=self.retry_window if mode == "retry" else None,
        )
        wid = ident.workflow_id
        sent_at = time.time()  # before waiting on this proxy's own delivery below
        delivering = self._delivering.get(wid)
        if delivering is not None:  # this proxy's answer to an identical call: it ends that run
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(delivering), 5)
        self._keep_meta(wid, call)
        try:
            own = mode == "retry" and not call.approval and self.send is not None
            outcome = await self._outcome(client, call, inp, wid, ident.reuse, sent_at, own)
        except ApplicationError as err:  # refused by the workflow: another call's identity
            text = f"refused: {err.message}"
            ids: dict[str, Any] = {"workflow_id": wid, "step": inp.step, "args_hash": inp.args_hash}
            return Reply(tool_error(text, "denied", **ids), "denied", **ids)
        reply = self._render(call, outcome)
        if mode == "retry" and outcome.kind in FINAL and not outcome.released:
            return dataclasses.replace(reply, deliver=call.caller)
        return reply

    def delivering(
        self, get_client: Callable[[], Awaitable[Client]], workflow_id: str, caller: str
    ) -> Callable[[bool], None]:
        """Called as a final answer is queued for the client; returns ``written(ok)``, to be
        called (from any thread) once it was written. A written answer is signalled to the
        call's workflow (``exactcall.mcp.delivered``), which then ends, so the next identical
        call is a new call; an identical call from this proxy waits for that first."""
        # before the write: a request that answers this answer arrives later, so only copies
        # sent before this moment are taken for retries of it
        queued_at, queued_mono = time.time(), time.monotonic()
        loop = asyncio.get_running_loop()
        answered = self._answered.pop(workflow_id, None)
        if answered is not None:  # an owned call: its report says it

            def told(ok: bool) -> None:
                if not answered.done():
                    answered.set_result((queued_at, queued_mono) if ok else None)

            def written_owned(ok: bool) -> None:
                with contextlib.suppress(RuntimeError):  # the loop has closed
                    loop.call_soon_threadsafe(told, ok)

            return written_owned
        done: asyncio.Future[None] = loop.create_future()
        self._delivering[workflow_id] = done

        def finish(_: Any = None) -> None:
            if not done.done():
                done.set_result(None)
            if self._delivering.get(workflow_id) is done:
                del self._delivering[workflow_id]

        async def signal(at: float) -> None:
            with contextlib.suppress(Exception):  # the run ended meanwhile: nothing to tell
                client = await get_client()
                handle = client.get_workflow_handle(workflow_id)
                # one string argument: a worker of an older proxy (one argument, which it
                # ignores) takes it as well
                await handle.signal(MCP_PROXY_DELIVERED_SIGNAL, f"{caller}{DELIVERED_AT}{at!r}")

        def after(ok: bool) -> None:
            if ok:
                asyncio.ensure_future(signal(queued_at)).add_done_callback(finish)
            else:  # it reached no client: the run keeps the outcome for a retry
                finish()

        def written(ok: bool) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(after, ok)

        return written

    def not_delivered(self, workflow_id: str | None) -> None:
        """The answer of the call of ``workflow_id`` is not written to any client."""
        answered = self._answered.pop(workflow_id or "", None)
        if answered is not None and not answered.done():
            answered.set_result(None)

    async def withdraw(self, client: Client, call: Call) -> None:
        """The client cancelled ``call``: once no other caller waits, its workflow cancels it
        (an owned call: this proxy does, when its run says no other caller waits)."""
        if call.workflow_id is None:
            return
        sending = self._owned.get(call.caller)
        if sending is not None:
            if await self._may_cancel(client, call.workflow_id):
                sending.cancel()
            return
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(call.workflow_id).signal(
                MCP_PROXY_WITHDRAW_SIGNAL, call.caller
            )

    def _keep_meta(self, wid: str, call: Call) -> None:
        drop = ("progressToken", CLIENT_KEY_META)
        self.metas[wid] = {k: v for k, v in call.meta.items() if k not in drop}
        self.origins[wid] = call.origin
        while len(self.metas) > MAX_KEPT_METAS:
            self.metas.pop(next(iter(self.metas)))
        while len(self.origins) > MAX_KEPT_METAS:
            self.origins.pop(next(iter(self.origins)))

    def _start(self, call: Call, inp: CallInput, wid: str, reuse: WorkflowIDReusePolicy) -> Any:
        return WithStartWorkflowOperation(
            MCP_PROXY_APPROVED_WORKFLOW if call.approval else MCP_PROXY_WORKFLOW,
            inp,
            id=wid,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=reuse,
            static_summary=f"MCP {self.server}.{call.tool} {inp.args_hash[:12]}",
        )

    async def _outcome(
        self,
        client: Client,
        call: Call,
        inp: CallInput,
        wid: str,
        reuse: WorkflowIDReusePolicy,
        sent_at: float,
        own: bool = False,
    ) -> Outcome:
        first = Wait(
            caller=inp.caller, args_hash=inp.args_hash, timeout_seconds=WAIT_SLICE, sent_at=sent_at
        )
        asked_next = False
        ended = 0  # the run ended as the update arrived (or an error): start anew
        for attempt in range(NEW_RUN_TRIES):
            if own:  # this proxy sends it, if no run holds the identity
                try:
                    await client.start_workflow(
                        MCP_PROXY_OWNED_WORKFLOW,
                        inp,
                        id=wid,
                        task_queue=self.task_queue,
                        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                        id_reuse_policy=reuse,
                        start_delay=OWNER_DELAY,
                        static_summary=f"MCP {self.server}.{call.tool} {inp.args_hash[:12]}",
                    )
                except WorkflowAlreadyStartedError:
                    pass  # a run holds it: attach to it below
                else:
                    call.workflow_id = wid
                    return await self._own(client, call, inp, wid, time.monotonic())
            try:
                handle = await client.start_update_with_start_workflow(
                    MCP_PROXY_WAIT_UPDATE,
                    first,
                    start_workflow_operation=self._start(call, inp, wid, reuse),
                    wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    result_type=Outcome,
                )
                call.workflow_id = wid
                if call.cancelled:  # cancelled while the update was on its way
                    await self.withdraw(client, call)
                return await self._wait(client, call, inp, wid, await handle.result())
            except WorkflowAlreadyStartedError:  # a client key's finished call
                return await self._recorded(client, inp, wid)
            except (WorkflowUpdateFailedError, RPCError) as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, ApplicationError) and cause.type == IntentConflict.code:
                    raise cause from None  # the identity belongs to other arguments
                if isinstance(cause, ApplicationError) and cause.type == "Delivered":
                    if not asked_next:  # a delivered run lingers for earlier copies: end it
                        asked_next = True
                        with contextlib.suppress(Exception):
                            await client.get_workflow_handle(wid).signal(MCP_PROXY_NEXT_SIGNAL)
                    await asyncio.sleep(min(0.005 * (attempt + 1), 0.1))  # that run is ending
                    continue
                ended += 1
                if ended == 3:
                    raise
        raise RuntimeError(f"{wid}: the previous identical call's run did not end")

    async def _own(
        self, client: Client, call: Call, inp: CallInput, wid: str, started: float
    ) -> Outcome:
        """Send an owned call to the server and answer; report its outcome to its run once
        the answer is written (or known not to be), with when it was. While the server works
        on it, a keepalive every second; a proxy that dies leaves no report, and the run
        makes the outcome unknown (never sent again by itself)."""
        assert self.send is not None
        handle = client.get_workflow_handle(wid)
        key = owned_key(client.namespace, wid, inp.step)
        if call.cancelled and await self._may_cancel(client, wid):  # while it was started
            sending: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            sending.cancel()  # not sent
        else:
            sending = asyncio.ensure_future(
                self.send(wid, call.tool, call.arguments, call.extra, key)
            )
        self._owned[call.caller] = sending
        alives: list[asyncio.Task[None]] = []  # the report goes after them: it is the run's last
        try:
            while not sending.done():
                await asyncio.wait({sending}, timeout=KEEPALIVE)
                if not sending.done():
                    alive = handle.signal(MCP_PROXY_OWNER_ALIVE_SIGNAL)
                    alives.append(self._later(asyncio.wait_for(alive, REPORT_RPC_TIMEOUT)))
        except asyncio.CancelledError:  # this proxy stops: report it if it ends in time
            sending.add_done_callback(
                lambda f: self._later(self._report(wid, self._reported(call, f), None))
            )
            raise
        finally:
            self._owned.pop(call.caller, None)
        report = self._reported(call, sending)
        outcome = self._owned_outcome(inp, wid, report, key)
        if report.kind == "unknown":  # answered once its reconciliation has started
            try:
                await handle.execute_update(MCP_PROXY_OWNER_REPORT_UPDATE, report, result_type=bool)
            except (WorkflowUpdateFailedError, RPCError) as err:
                log.warning("mcp_proxy.report_lost", workflow_id=wid, error=str(err))
            return outcome
        answered: asyncio.Future[Delivery | None] = asyncio.get_running_loop().create_future()
        if outcome.kind in FINAL and not outcome.released and not call.cancelled:
            self._answered[wid] = answered
        else:
            answered.set_result(None)
        reporting = self._report(wid, report, answered, started)
        if alives and not all(a.done() for a in alives):
            reporting = _after(alives, reporting)
        reported: asyncio.Future[None] = asyncio.ensure_future(reporting)
        self._delivering[wid] = reported  # an identical call from here waits for it

        def forget(_: Any) -> None:
            if self._delivering.get(wid) is reported:
                del self._delivering[wid]
            if self._answered.get(wid) is answered:
                del self._answered[wid]

        reported.add_done_callback(forget)
        self._late.add(reported)
        reported.add_done_callback(self._late.discard)
        return outcome

    @staticmethod
    async def _may_cancel(client: Client, wid: str) -> bool:
        """Whether the owner's cancelled call may be cancelled: no other caller waits."""
        handle = client.get_workflow_handle(wid)
        try:
            return bool(
                await handle.execute_update(MCP_PROXY_OWNER_WITHDRAW_UPDATE, result_type=bool)
            )
        except Exception:  # ended, or unreachable: it goes on
            return False

    async def drain(self) -> None:
        """Before the proxy stops: let the reports of answered calls reach their runs."""
        if self._late:
            await asyncio.wait(set(self._late), timeout=REPORT_WAIT + 3)

    def _later(self, aw: Awaitable[Any]) -> asyncio.Task[None]:
        async def quietly() -> None:
            with contextlib.suppress(Exception):
                await aw

        task = asyncio.ensure_future(quietly())
        self._late.add(task)
        task.add_done_callback(self._late.discard)
        return task

    @staticmethod
    def _reported(call: Call, sending: asyncio.Future[dict[str, Any]]) -> Report:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        withdrawn = call.cancelled
        if sending.cancelled():
            message = "cancelled before it was sent"
            return Report(kind="not_sent", message=message, withdrawn=True, at=at)
        exc = sending.exception()
        if exc is None:
            return Report(kind="done", result=sending.result(), withdrawn=withdrawn, at=at)
        if isinstance(exc, exactcall.NotExecuted):
            message = f"it did not happen: {exc.message}"
            return Report(kind="not_sent", message=message, withdrawn=withdrawn, at=at)
        return Report(kind="unknown", message=f"{exc}", withdrawn=withdrawn, at=at)

    async def _report(
        self,
        wid: str,
        report: Report,
        answered: asyncio.Future[Delivery | None] | None,
        started: float = 0.0,
    ) -> None:
        """Tell the run what the call did, and whether (when) its answer was written; tried
        for a few seconds, through the proxy's current client (after a takeover, the new
        server's). A run that gets no report makes the outcome unknown: safe, but a person
        then has to decide."""
        if answered is not None:
            try:
                at = await asyncio.wait_for(asyncio.shield(answered), REPORT_WAIT)
            except TimeoutError:
                at = None
            if at is not None:  # when, by the proxy's clock, and how long after the start
                update = {"delivered_at": at[0], "delivered_after": max(at[1] - started, 0.0)}
                report = report.model_copy(update=update)
        error = "no client"
        for attempt in range(REPORT_TRIES):
            try:
                client = await asyncio.wait_for(self.get_client(), REPORT_RPC_TIMEOUT)
                handle = client.get_workflow_handle(wid)
                await asyncio.wait_for(
                    handle.signal(MCP_PROXY_OWNER_REPORT_SIGNAL, report), REPORT_RPC_TIMEOUT
                )
                return
            except Exception as err:  # unreachable, or the server is being replaced
                error = f"{type(err).__name__}: {err}"
                if "not found" in str(err).lower():
                    break
            await asyncio.sleep(min(0.05 * (attempt + 1), 0.5))
        log.warning("mcp_proxy.report_lost", workflow_id=wid, error=error)

    def _owned_outcome(self, inp: CallInput, wid: str, r: Report, key: str) -> Outcome:
        """The outcome the run records from ``r`` (the same, without waiting for it)."""
        ids: dict[str, Any] = {"workflow_id": wid, "step": inp.step, "args_hash": inp.args_hash}
        ids["at"] = r.at
        why = "the request was cancelled"
        if r.kind == "done":
            result = r.result or {}
            released = result.get("resultType") == "input_required"
            message = f"{why}; it had run" if r.withdrawn else None
            return Outcome(kind="done", result=result, message=message, released=released, **ids)
        if r.kind == "not_sent":
            if r.withdrawn:
                message = f"{why} before it was sent"
                return Outcome(kind="cancelled", message=message, released=True, **ids)
            return Outcome(kind="failed", message=r.message, released=True, **ids)
        return Outcome(kind="unknown", message=r.message, reconcile_id=reconcile_id(key), **ids)

    async def _recorded(self, client: Client, inp: CallInput, wid: str) -> Outcome:
        outcome: Outcome = await client.get_workflow_handle(wid, result_type=Outcome).result()
        if outcome.args_hash != inp.args_hash:
            raise exactcall.IntentConflict(
                f"the client key was already used for another call (args hash "
                f"{outcome.args_hash}); this call has {inp.args_hash}. Nothing was executed."
            )
        return outcome.model_copy(update={"deduplicated": True, "repeat": "key"})

    async def _wait(
        self, client: Client, call: Call, inp: CallInput, wid: str, outcome: Outcome
    ) -> Outcome:
        """Hold the client until the outcome is known: while a person is asked (up to the
        approval wait, with progress notifications that say how to approve), while the call
        runs, and while a verdict on an unknown outcome is being carried out."""
        sent, until = 0, call.started + self.approval_wait
        handle = client.get_workflow_handle(wid)
        while True:
            w = Wait(caller=inp.caller, args_hash=inp.args_hash, timeout_seconds=WAIT_SLICE)
            if outcome.kind == "pending" and outcome.awaiting_approval:
                left = until - time.monotonic()
                if left <= 0:
                    return outcome
                sent += 1
                self._progress(call, sent, self._approve_text(outcome))
                slice_ = max(min(SHORT_SLICE, left), 0.05)
                w = w.model_copy(update={"timeout_seconds": slice_, "until_approval": False})
            elif outcome.kind == "unknown" and await self._settling(client, outcome):
                w = w.model_copy(update={"timeout_seconds": SHORT_SLICE, "past_unknown": True})
            elif outcome.kind != "pending":
                return outcome
            try:
                outcome = await handle.execute_update(MCP_PROXY_WAIT_UPDATE, w, result_type=Outcome)
            except (WorkflowUpdateFailedError, RPCError):  # it ended meanwhile: its result
                return await self._final(handle)

    @staticmethod
    async def _final(handle: Any) -> Outcome:
        try:
            outcome: Outcome = await handle.result(result_type=Outcome)
        except WorkflowFailureError as err:  # a keyed call that did not happen
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            return Outcome(
                kind="failed", workflow_id=handle.id, step="", args_hash="", message=message
            )
        return outcome

    @staticmethod
    async def _settling(client: Client, outcome: Outcome) -> bool:
        """Whether an unknown outcome is being settled now (a verdict being carried out)."""
        if outcome.reconcile_id is None:
            return False
        try:
            st = await reconciliation_state(client, outcome.reconcile_id)
        except Exception:  # not queryable now: report what is known
            return False
        return st.phase in ("probing", "re-running", "settled")

    def _repeat_note(self, call: Call, o: Outcome) -> str:
        """What a model reads when it is answered without anything being executed."""
        what, when = f"{self.server}.{call.tool}", _clock(o.at)
        again = "nothing was sent to the server again"
        if o.repeat == "running":
            return (
                f"exactcall proxy: an identical {what} call was already in progress; this is "
                f"its outcome (recorded {when}). It ran once; {again}."
            )
        if o.repeat == "window":
            window = duration_text(o.window_seconds or 0)
            return (
                f"exactcall proxy: {what} already ran with these exact arguments at {when}, and "
                f"identical calls within {window} of it run once (--dedupe-window), so {again}. "
                "To run it again on purpose, send it after the window, or with a new _meta "
                f"{CLIENT_KEY_META}."
            )
        if o.repeat == "key":
            return (
                f"exactcall proxy: the call with this {CLIENT_KEY_META} already ran ({what}, "
                f"recorded {when}); this is its outcome and {again}. Send a new key to run it "
                "again."
            )
        return (
            f"exactcall proxy: an identical {what} call ran at {when}, and its answer never "
            f"reached a client (the request was cancelled or the connection dropped); this is "
            f"that answer, and {again}. Sending the same call again now runs it again."
        )

    def _approve_text(self, o: Outcome) -> str:
        return (
            f"waiting for a person to approve these exact arguments (args hash {o.args_hash}): "
            f"exactcall approve {o.workflow_id} {o.step} --hash {o.args_hash}{self._cli_flags()}"
        )

    def _render(self, call: Call, o: Outcome) -> Reply:
        ids: dict[str, Any] = {
            "args_hash": o.args_hash,
            "workflow_id": o.workflow_id,
            "step": o.step,
        }
        flags = self._cli_flags()
        if o.kind == "done" and o.result is not None:
            result = {"resultType": "complete", **o.result}  # required on 2026-07-28
            if o.deduplicated:
                result["_meta"] = {**(result.get("_meta") or {}), DEDUPLICATED_META: True}
                note = {"type": "text", "text": self._repeat_note(call, o)}
                content = result.get("content")
                result["content"] = [note, *(content if isinstance(content, list) else [])]
            outcome = (
                "deduplicated"
                if o.deduplicated
                else ("failed" if result.get("isError") else "executed")
            )
            settled = (o.message or "").startswith("decided by")  # the run's verdict wording
            return Reply(result, outcome, settled=settled, **ids)
        if o.kind == "pending":
            text = (
                f"{self.server}.{call.tool} is waiting for an approval of these exact arguments "
                f"(args hash {o.args_hash}); nothing has run. Approve it with: exactcall approve "
                f"{o.workflow_id} {o.step} --hash {o.args_hash}{flags} (exactcall approvals list"
                f"{flags} shows it; exactcall deny ... refuses it), then send the same call again "
                "to get its result."
            )
            return Reply(tool_error(text, "awaiting_approval", **ids), "awaiting_approval", **ids)
        if o.kind == "unknown":
            flags = self._resolve_flags()
            text = (
                f"outcome unknown: {self.server}.{call.tool} may or may not have run (the proxy "
                "or the server stopped during the call). It is not sent again. `exactcall "
                f"unresolved{flags}` lists it; resolve it with: exactcall resolve {o.workflow_id} "
                f"{o.step} --landed --result JSON | --not-landed | --abandon{flags} (--result: "
                f"the tool's result, e.g. '\"done\"'). ({o.message})"
            )
            return Reply(tool_error(text, "unknown", **ids), "unknown", **ids)
        kind = "denied" if o.kind == "denied" else "failed"
        text = f"{self.server}.{call.tool} {o.kind}: {o.message}"
        if o.deduplicated:
            text = f"{self._repeat_note(call, o)}\n{text}"
        audited = "deduplicated" if o.deduplicated and kind != "denied" else kind
        return Reply(tool_error(text, kind, **ids), audited, **ids)


async def _no_client() -> Client:
    raise RuntimeError("this proxy has no Temporal client yet")


async def _after(tasks: list[asyncio.Task[None]], then: Awaitable[None]) -> None:
    """``then`` once ``tasks`` (keepalives still in flight) have ended."""
    await asyncio.wait(tasks)
    await then
