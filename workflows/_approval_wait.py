"""Waiting for a person inside the workflow: request, pre-approval, decision, expiry."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

from exactcall._model import Intent
from exactcall._tool import Tool
from exactcall._ui import PENDING_MARK, pending_details, with_pending
from exactcall.approvals._binding import (
    REQUESTED_BY_MEMO,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGrant,
    ApprovalRequest,
)
from exactcall.workflows._state import WorkflowState, state

__all__ = ["show_pending", "wait_for_approval"]


async def wait_for_approval(
    t: Tool, intent: Intent, reasons: tuple[str, ...] = ()
) -> ApprovalGrant:
    st = state()
    now = workflow.now()
    req = ApprovalRequest(
        workflow_id=intent.workflow_id,
        step=intent.step,
        tool=intent.tool,
        args=intent.args,
        args_hash=intent.args_hash,
        key=intent.key,
        requested_at=now,
        expires_at=now + t.options.approval_timeout,
        requested_by=workflow.memo_value(REQUESTED_BY_MEMO, None, type_hint=str | None),  # type: ignore[arg-type]  # the SDK's hint is narrower than what it decodes
        approvals_needed=t.options.min_approvals,
        reasons=reasons,
    )
    older = t.older_hashes(intent.args)
    st.book.request(req, t.options.approvers, t.options.requester_may_approve, now, older)
    st.publish_pending()
    show_pending(st)
    workflow.logger.info(
        "exactcall approval.requested: %s %s hash=%s expires=%s",
        t.name,
        intent.step,
        intent.args_hash,
        req.expires_at.isoformat(),
    )
    try:
        await workflow.wait_condition(
            lambda: st.book.state(intent.step) != "pending",
            timeout=req.expires_at - now,
            timeout_summary=f"approval of {t.name} {intent.step} expires",
        )
    except TimeoutError:
        st.book.expire(intent.step, workflow.now())
    except asyncio.CancelledError:
        # the caller (or the workflow) was cancelled: the request is no longer pending, it
        # leaves the listing, and a later decision is rejected as not pending
        st.book.cancel(intent.step, workflow.now())
        st.publish_pending()
        show_pending(st)
        workflow.logger.info("exactcall approval.cancelled: %s %s", t.name, intent.step)
        raise
    st.publish_pending()
    show_pending(st)
    return _outcome(t, intent, req)


def show_pending(st: WorkflowState) -> None:
    """Mirror the pending calls into the workflow's current details (the Temporal UI shows
    them on the workflow's page): exact arguments, hash, expiry, the approve/deny commands.

    Not a command: it changes no history. The workflow's own details are kept."""
    section = pending_details(st.book.pending(), workflow.info().namespace)
    current = workflow.get_current_details()
    if section or PENDING_MARK in current:
        workflow.set_current_details(with_pending(current, section))


def _outcome(t: Tool, intent: Intent, req: ApprovalRequest) -> ApprovalGrant:
    book = state().book
    decided = book.state(intent.step)
    fields: dict[str, Any] = {
        "tool": t.name,
        "step": intent.step,
        "args_hash": intent.args_hash,
        "workflow_id": intent.workflow_id,
    }
    if decided == "approved":
        return book.grant(intent.step)
    if decided == "denied":
        reason = book.open[intent.step].reasons[-1]
        raise ApprovalDenied(f"{t.name} {intent.step} was denied: {reason}", **fields)
    raise ApprovalExpired(
        f"{t.name} {intent.step} was not approved before {req.expires_at.isoformat()}; nothing ran",
        **fields,
    )
