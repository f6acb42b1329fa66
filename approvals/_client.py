"""Deciding on pending calls from Python: the same operations as the ``exactcall`` CLI."""

from __future__ import annotations

import asyncio
import base64
import getpass
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter
from temporalio.api.workflow.v1 import WorkflowExecutionInfo
from temporalio.api.workflowservice.v1 import (
    ListWorkflowExecutionsRequest,
    ListWorkflowExecutionsResponse,
)
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.converter import WorkflowSerializationContext

from exactcall._canonical import args_hash
from exactcall._confirm import confirm_by_query
from exactcall.approvals._binding import (
    APPROVALS_QUERY,
    DECIDE_SIGNAL,
    PENDING_ATTRIBUTE,
    PENDING_MEMO,
    ApprovalRequest,
    ApprovalsView,
    Decision,
    DecisionRecord,
    signed_payload,
)

__all__ = [
    "DecisionResult",
    "approve",
    "decide",
    "deny",
    "list_pending",
    "load_signing_key",
    "pending",
    "preapprove",
    "view",
]

PAGE_SIZE = 1000
"""Workflows per visibility page (the most a Temporal server returns by default)."""

_REQUESTS = TypeAdapter(list[ApprovalRequest])


@dataclass(frozen=True)
class DecisionResult:
    """What the workflow made of a decision (confirmed by query after the signal)."""

    decision: Decision
    record: DecisionRecord | None
    """None when no worker answered the query in time: the signal is recorded in history
    and will be applied, but its outcome could not be confirmed."""
    queued: bool = False
    """The workflow has made no exactcall call yet, so it has no approvals to check the
    decision against: Temporal holds the signal, and the workflow checks it at its first
    exactcall call (a pre-approval for a later call is then still there for it)."""

    @property
    def accepted(self) -> bool:
        return self.record is not None and self.record.accepted

    @property
    def outcome(self) -> str:
        if self.record is not None:
            return self.record.outcome
        if self.queued:
            return "sent; queued until the workflow's first exactcall call, which checks it"
        return "sent; not confirmed (no worker answered)"


async def view(client: Client, workflow_id: str) -> ApprovalsView:
    """Pending requests, decisions and pre-approvals of a workflow (query; needs a worker).

    A workflow that has made no exactcall call yet has none (and no such query).
    """
    found = await _view(client, workflow_id)
    return found if found is not None else ApprovalsView(pending=[], decisions=[], preapprovals=[])


async def _view(client: Client, workflow_id: str) -> ApprovalsView | None:
    """None: the workflow has made no exactcall call (exactcall adds its query then)."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        return await handle.query(APPROVALS_QUERY, result_type=ApprovalsView)
    except WorkflowQueryFailedError as exc:
        if f"Query handler for '{APPROVALS_QUERY}' expected but not found" not in str(exc):
            raise
        return None


async def pending(client: Client, workflow_id: str, step: str | None = None) -> ApprovalRequest:
    """The pending request of ``step`` (or the only one), by query."""
    reqs = (await view(client, workflow_id)).pending
    if step is not None:
        reqs = [r for r in reqs if r.step == step]
    if not reqs:
        what = f"step {step!r}" if step else "any call"
        raise LookupError(f"workflow {workflow_id!r} has no {what} waiting for approval")
    if len(reqs) > 1:
        steps = ", ".join(r.step for r in reqs)
        raise LookupError(f"workflow {workflow_id!r} has several pending calls ({steps}): name one")
    return reqs[0]


async def list_pending(
    client: Client, limit: int | None = None, *, page_size: int = PAGE_SIZE
) -> list[ApprovalRequest]:
    """Every pending call across workflows (visibility + memo; no worker needed).

    ``limit`` caps the number of workflows read. Pages of ``page_size`` workflows are read
    one ahead: the server prepares the next page while this one is decoded."""
    out: list[ApprovalRequest] = []
    query = f"{PENDING_ATTRIBUTE} = true AND ExecutionStatus = 'Running'"
    async for page in _pages(client, query, limit, page_size):
        for info in page:
            out += await _requests(client, info)
    return out


async def _pages(
    client: Client, query: str, limit: int | None, page_size: int
) -> AsyncIterator[Sequence[WorkflowExecutionInfo]]:
    """The visibility pages of ``query``, the next one requested before this one is used."""
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")

    async def fetch(token: bytes, size: int) -> ListWorkflowExecutionsResponse:
        req = ListWorkflowExecutionsRequest(
            namespace=client.namespace, query=query, page_size=size, next_page_token=token
        )
        return await client.workflow_service.list_workflow_executions(req, retry=True)

    left = limit
    nxt = asyncio.ensure_future(fetch(b"", min(page_size, left or page_size)))
    try:
        while True:
            resp = await nxt
            rows = resp.executions if left is None else resp.executions[:left]
            if left is not None:
                left -= len(rows)
            more = bool(resp.next_page_token) and (left is None or left > 0)
            if more:
                size = page_size if left is None else min(page_size, left)
                nxt = asyncio.ensure_future(fetch(resp.next_page_token, size))
            yield rows
            if not more:
                return
    finally:
        nxt.cancel()


async def _requests(client: Client, info: WorkflowExecutionInfo) -> list[ApprovalRequest]:
    """The pending requests in one workflow's memo. JSON memos (exactcall's converter with no
    codec or external storage) are validated straight from their bytes."""
    payload = info.memo.fields.get(PENDING_MEMO)
    if payload is None:
        return []
    dc = client.data_converter
    plain = dc.payload_codec is None and getattr(dc, "external_storage", None) is None
    if plain and payload.metadata.get("encoding") == b"json/plain":
        return [] if payload.data.strip() == b"null" else _REQUESTS.validate_json(payload.data)
    context = WorkflowSerializationContext(
        namespace=client.namespace, workflow_id=info.execution.workflow_id
    )
    value = (await dc.with_context(context).decode([payload]))[0]
    return _REQUESTS.validate_python(value or [])


def load_signing_key(path: str | Path) -> Any:
    """An Ed25519 private key from a PEM file (for signed decisions)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


async def decide(
    client: Client,
    workflow_id: str,
    decision: Literal["approve", "deny"],
    *,
    args_hash: str,
    step: str | None = None,
    tool: str | None = None,
    by: str | None = None,
    reason: str | None = None,
    expires_at: Any = None,
    signing_key: Any = None,
    confirm_timeout: float = 10.0,
) -> DecisionResult:
    """Send a decision signal, then confirm its outcome by query."""
    d = Decision(
        decision=decision,
        args_hash=args_hash,
        step=step,
        tool=tool,
        by=by or getpass.getuser(),
        reason=reason,
        decision_id=uuid.uuid4().hex,
        expires_at=expires_at,
    )
    if signing_key is not None:
        sig = signing_key.sign(signed_payload(workflow_id, d))
        d = d.model_copy(update={"signature": base64.b64encode(sig).decode()})
    handle = client.get_workflow_handle(workflow_id)
    await handle.signal(DECIDE_SIGNAL, d)
    return await _confirm(client, workflow_id, d, confirm_timeout)


async def _confirm(client: Client, workflow_id: str, d: Decision, timeout: float) -> DecisionResult:
    def mine(v: ApprovalsView | None) -> DecisionResult | None:
        if v is None:  # no exactcall call yet: Temporal holds the signal for the first one
            return DecisionResult(d, None, queued=True)
        rec = next((r for r in v.decisions if r.decision.decision_id == d.decision_id), None)
        return DecisionResult(d, rec) if rec is not None else None

    found = await confirm_by_query(lambda: _view(client, workflow_id), mine, timeout)
    return found if found is not None else DecisionResult(d, None)


async def approve(
    client: Client, workflow_id: str, step: str | None = None, *, args_hash: str, **kw: Any
) -> DecisionResult:
    """Approve the pending call ``step`` whose canonical args hash to ``args_hash``."""
    return await _on_step(client, workflow_id, step, "approve", args_hash, kw)


async def deny(
    client: Client, workflow_id: str, step: str | None = None, *, args_hash: str, **kw: Any
) -> DecisionResult:
    """Deny the pending call ``step``: it ends with ApprovalDenied and nothing runs."""
    return await _on_step(client, workflow_id, step, "deny", args_hash, kw)


async def _on_step(
    client: Client,
    workflow_id: str,
    step: str | None,
    verdict: Literal["approve", "deny"],
    args_hash: str,
    kw: dict[str, Any],
) -> DecisionResult:
    expires = kw.pop("expires_at", None)
    if expires is None and step is not None and kw.get("signing_key") is not None:
        expires = (await pending(client, workflow_id, step)).expires_at  # covered by signature
    return await decide(
        client, workflow_id, verdict, args_hash=args_hash, step=step, expires_at=expires, **kw
    )


async def preapprove(
    client: Client, workflow_id: str, tool: str, args: dict[str, Any], **kw: Any
) -> DecisionResult:
    """Approve a call before the workflow reaches it: consumed once, by the first call of
    ``tool`` whose canonical arguments hash the same. ``args`` are the canonical arguments
    (every parameter by name); compute the hash with ``exactcall.intent_hash`` if unsure."""
    from exactcall._errors import UnknownTool
    from exactcall._tool import get_tool

    try:
        h = get_tool(tool).hash(**args)
    except UnknownTool:  # not imported here: the args must already be canonical
        h = args_hash(tool, args)
    return await decide(client, workflow_id, "approve", args_hash=h, tool=tool, **kw)
