"""Deciding on pending calls from Python: the same operations as the ``exactcall`` CLI."""

from __future__ import annotations

import base64
import getpass
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from temporalio.client import Client

from exactcall._approval import (
    DECIDE_SIGNAL,
    PENDING_ATTRIBUTE,
    PENDING_MEMO,
    QUERY,
    ApprovalRequest,
    ApprovalsView,
    Decision,
    DecisionRecord,
    signed_payload,
)
from exactcall._canonical import args_hash
from exactcall._confirm import confirm_by_query

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


@dataclass(frozen=True)
class DecisionResult:
    """What the workflow made of a decision (confirmed by query after the signal)."""

    decision: Decision
    record: DecisionRecord | None
    """None when no worker answered the query in time: the signal is recorded in history
    and will be applied, but its outcome could not be confirmed."""

    @property
    def accepted(self) -> bool:
        return self.record is not None and self.record.accepted

    @property
    def outcome(self) -> str:
        return self.record.outcome if self.record else "sent; not confirmed (no worker answered)"


async def view(client: Client, workflow_id: str) -> ApprovalsView:
    """Pending requests, decisions and pre-approvals of a workflow (query; needs a worker)."""
    return await client.get_workflow_handle(workflow_id).query(QUERY, result_type=ApprovalsView)


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


async def list_pending(client: Client, limit: int | None = None) -> list[ApprovalRequest]:
    """Every pending call across workflows (visibility + memo; no worker needed)."""
    out: list[ApprovalRequest] = []
    query = f"{PENDING_ATTRIBUTE} = true AND ExecutionStatus = 'Running'"
    async for wf in client.list_workflows(query, limit=limit):
        memo = await wf.memo()
        out += [ApprovalRequest.model_validate(p) for p in memo.get(PENDING_MEMO) or []]
    return out


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
    return DecisionResult(d, await _confirm(client, workflow_id, d, confirm_timeout))


async def _confirm(
    client: Client, workflow_id: str, d: Decision, timeout: float
) -> DecisionRecord | None:
    def mine(v: ApprovalsView) -> DecisionRecord | None:
        return next((r for r in v.decisions if r.decision.decision_id == d.decision_id), None)

    return await confirm_by_query(lambda: view(client, workflow_id), mine, timeout)


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
