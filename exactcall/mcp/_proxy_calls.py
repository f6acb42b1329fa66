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
from datetime import datetime, timedelta
from typing import Any

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
from exactcall._errors import IntentConflict
from exactcall.reconciliation import state as reconciliation_state

from . import DEDUPLICATED_META
from . import KEY_META as CLIENT_KEY_META
from ._proxy_policy import duration_text
from ._proxy_workflow import (
    APPROVED_WORKFLOW,
    DELIVERED_AT,
    DELIVERED_SIGNAL,
    NEXT_SIGNAL,
    WAIT_UPDATE,
    WITHDRAW_SIGNAL,
    WORKFLOW,
    CallInput,
    Outcome,
    Wait,
    proxy_tool,
)

__all__ = ["Call", "Caller", "Reply", "identity", "tool_error"]

OUTCOME_META = "io.exactcall/outcome"
MAX_CLIENT_KEY = 200
WAIT_SLICE = 30.0
SHORT_SLICE = 2.0
MAX_KEPT_METAS = 1000
NEW_RUN_TRIES = 100
"""Attempts to start a new run while the previous identical call's run is ending."""
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
        self._progress = progress
        self.metas: dict[str, dict[str, Any]] = {}
        self.origins: dict[str, Any] = {}
        self._delivering: dict[str, asyncio.Future[None]] = {}

    async def run(self, client: Client, call: Call) -> Reply:
        try:
            ident = identity(self.server, call)
        except exactcall.InvalidCall as err:
            return Reply(tool_error(f"{err.message} Nothing was sent.", "denied"), "denied")
        mode = "key" if ident.keyed else ("window" if call.window else "retry")
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
            outcome = await self._outcome(client, call, inp, wid, ident.reuse, sent_at)
        except ApplicationError as err:  # refused by the workflow: another call's identity
            text = f"refused: {err.message}"
            ids = {"workflow_id": wid, "step": inp.step, "args_hash": inp.args_hash}
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
        queued_at = time.time()
        loop = asyncio.get_running_loop()
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
                await handle.signal(DELIVERED_SIGNAL, f"{caller}{DELIVERED_AT}{at!r}")

        def after(ok: bool) -> None:
            if ok:
                asyncio.ensure_future(signal(queued_at)).add_done_callback(finish)
            else:  # it reached no client: the run keeps the outcome for a retry
                finish()

        def written(ok: bool) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(after, ok)

        return written

    async def withdraw(self, client: Client, call: Call) -> None:
        """The client cancelled ``call``: once no other caller waits, its workflow cancels it."""
        if call.workflow_id is None:
            return
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(call.workflow_id).signal(WITHDRAW_SIGNAL, call.caller)

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
            APPROVED_WORKFLOW if call.approval else WORKFLOW,
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
    ) -> Outcome:
        first = Wait(
            caller=inp.caller, args_hash=inp.args_hash, timeout_seconds=WAIT_SLICE, sent_at=sent_at
        )
        asked_next = False
        ended = 0  # the run ended as the update arrived (or an error): start anew
        for attempt in range(NEW_RUN_TRIES):
            try:
                handle = await client.start_update_with_start_workflow(
                    WAIT_UPDATE,
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
                            await client.get_workflow_handle(wid).signal(NEXT_SIGNAL)
                    await asyncio.sleep(min(0.005 * (attempt + 1), 0.1))  # that run is ending
                    continue
                ended += 1
                if ended == 3:
                    raise
        raise RuntimeError(f"{wid}: the previous identical call's run did not end")

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
        waited, sent = 0.0, 0
        handle = client.get_workflow_handle(wid)
        while True:
            w = Wait(caller=inp.caller, args_hash=inp.args_hash, timeout_seconds=WAIT_SLICE)
            if outcome.kind == "pending" and outcome.awaiting_approval:
                if waited >= self.approval_wait:
                    return outcome
                sent += 1
                self._progress(call, sent, self._approve_text(outcome))
                slice_ = max(min(SHORT_SLICE, self.approval_wait - waited), 0.05)
                waited += slice_
                w = w.model_copy(update={"timeout_seconds": slice_, "until_approval": False})
            elif outcome.kind == "unknown" and await self._settling(client, outcome):
                w = w.model_copy(update={"timeout_seconds": SHORT_SLICE, "past_unknown": True})
            elif outcome.kind != "pending":
                return outcome
            try:
                outcome = await handle.execute_update(WAIT_UPDATE, w, result_type=Outcome)
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
        ids = {"args_hash": o.args_hash, "workflow_id": o.workflow_id, "step": o.step}
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
            return Reply(result, outcome, **ids)
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
            text = (
                f"outcome unknown: {self.server}.{call.tool} may or may not have run (the proxy "
                "or the server stopped during the call). It is not sent again. `exactcall "
                f"unresolved{flags}` lists it; resolve it with: exactcall resolve {o.workflow_id} "
                f"{o.step} --landed [--result JSON] | --not-landed | --abandon{flags}. "
                f"({o.message})"
            )
            return Reply(tool_error(text, "unknown", **ids), "unknown", **ids)
        kind = "denied" if o.kind == "denied" else "failed"
        text = f"{self.server}.{call.tool} {o.kind}: {o.message}"
        if o.deduplicated:
            text = f"{self._repeat_note(call, o)}\n{text}"
        audited = "deduplicated" if o.deduplicated and kind != "denied" else kind
        return Reply(tool_error(text, kind, **ids), audited, **ids)


def _clock(at: str | None) -> str:
    """``2026-12-02T19:03:04+00:00`` -> ``19:03:04 UTC`` (the day too when it is not today)."""
    if at is None:
        return "earlier"
    try:
        t = datetime.fromisoformat(at)
    except ValueError:
        return at
    today = datetime.now(t.tzinfo).date() == t.date()
    return t.strftime("%H:%M:%S UTC" if today else "%Y-%m-%d %H:%M:%S UTC")


def tool_error(
    text: str,
    outcome: str,
    workflow_id: str | None = None,
    step: str | None = None,
    args_hash: str | None = None,
) -> dict[str, Any]:
    """An MCP tool error result from the proxy itself."""
    meta = {OUTCOME_META: outcome}
    for k, v in (("workflow-id", workflow_id), ("step", step), ("args-hash", args_hash)):
        if v is not None:
            meta[f"io.exactcall/{k}"] = v
    return {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "resultType": "complete",
        "_meta": meta,
    }
