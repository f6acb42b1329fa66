"""A write call the proxy took over: its identity, its workflow, the wait, the answer.

Identity (documented formulas):

* ``args_hash = exactcall.intent_hash("exactcall.mcp_proxy", server=NAME, tool=TOOL,
  arguments=ARGS, extra=OTHER_PARAMS)``: the hash approvals are bound to;
* without a client key, workflow id ``exactcall-mcp-<NAME>-<args_hash[:32]>`` (identical calls
  share it for the window), step ``<tool>@<epoch ms of the run's first call>``;
* with ``_meta`` ``io.exactcall/idempotency-key`` = K, workflow id
  ``exactcall-mcp-<NAME>-key-<sha256(K)[:32]>``, step ``<tool>``; K reused with other
  arguments is refused (IntentConflict) before anything runs.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
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
from ._proxy_workflow import (
    APPROVED_WORKFLOW,
    WAIT_UPDATE,
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


@dataclass
class Call:
    """One intercepted ``tools/call``."""

    request_id: Any
    tool: str
    arguments: dict[str, Any]
    extra: dict[str, Any]
    meta: dict[str, Any]
    approval: bool

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
        window: timedelta,
        approval_wait: timedelta,
        task_queue: str,
        cli_flags: Any,
        progress: Any,
    ) -> None:
        """``cli_flags()``: connection flags for printed commands; ``progress(token, n,
        message)``: sends a progress notification to the client. ``metas``: the client's
        ``_meta`` of each call by workflow id, for the upstream request (not identity)."""
        self.server = server
        self.window = window.total_seconds()
        self.approval_wait = approval_wait.total_seconds()
        self.task_queue = task_queue
        self._cli_flags = cli_flags
        self._progress = progress
        self.metas: dict[str, dict[str, Any]] = {}

    async def run(self, client: Client, call: Call) -> Reply:
        try:
            ident = identity(self.server, call)
        except exactcall.InvalidCall as err:
            return Reply(tool_error(f"{err.message} Nothing was sent.", "denied"), "denied")
        inp = CallInput(
            server=self.server,
            tool=call.tool,
            arguments=call.arguments,
            extra=call.extra,
            args_hash=ident.args_hash,
            step=ident.step(call.tool),
            window_seconds=None if ident.keyed else self.window,
            caller=uuid.uuid4().hex,
        )
        wid = ident.workflow_id
        self._keep_meta(wid, call.meta)
        try:
            outcome = await self._outcome(client, call, inp, wid, ident.reuse)
        except ApplicationError as err:  # refused by the workflow: another call's identity
            text = f"refused: {err.message}"
            ids = {"workflow_id": wid, "step": inp.step, "args_hash": inp.args_hash}
            return Reply(tool_error(text, "denied", **ids), "denied", **ids)
        return self._render(call, outcome)

    def _keep_meta(self, wid: str, meta: dict[str, Any]) -> None:
        forwarded = {k: v for k, v in meta.items() if k not in ("progressToken", CLIENT_KEY_META)}
        self.metas[wid] = forwarded
        while len(self.metas) > MAX_KEPT_METAS:
            self.metas.pop(next(iter(self.metas)))

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
        self, client: Client, call: Call, inp: CallInput, wid: str, reuse: WorkflowIDReusePolicy
    ) -> Outcome:
        first = Wait(caller=inp.caller, args_hash=inp.args_hash, timeout_seconds=WAIT_SLICE)
        for attempt in range(3):
            try:
                handle = await client.start_update_with_start_workflow(
                    WAIT_UPDATE,
                    first,
                    start_workflow_operation=self._start(call, inp, wid, reuse),
                    wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    result_type=Outcome,
                )
                return await self._wait(client, call, inp, wid, await handle.result())
            except WorkflowAlreadyStartedError:  # a client key's finished call
                return await self._recorded(client, inp, wid)
            except (WorkflowUpdateFailedError, RPCError) as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, ApplicationError) and cause.type == IntentConflict.code:
                    raise cause from None  # the identity belongs to other arguments
                if attempt == 2:  # else the run ended as the update arrived: start anew
                    raise
        raise AssertionError("unreachable")

    async def _recorded(self, client: Client, inp: CallInput, wid: str) -> Outcome:
        outcome: Outcome = await client.get_workflow_handle(wid, result_type=Outcome).result()
        if outcome.args_hash != inp.args_hash:
            raise exactcall.IntentConflict(
                f"the client key was already used for another call (args hash "
                f"{outcome.args_hash}); this call has {inp.args_hash}. Nothing was executed."
            )
        return outcome.model_copy(update={"deduplicated": True})

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
                self._progress(call.progress_token, sent, self._approve_text(outcome))
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
        dedupe = " (the recorded outcome of an identical call)" if o.deduplicated else ""
        text = f"{self.server}.{call.tool} {o.kind}{dedupe}: {o.message}"
        audited = "deduplicated" if o.deduplicated and kind != "denied" else kind
        return Reply(tool_error(text, kind, **ids), audited, **ids)


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
