"""Approvals bound to the exact arguments of a call (installed as ``exactcall.approvals``).

A tool declared ``@exactcall.tool(approval=True)`` (or with a policy) waits until a person
approves that exact call: a Temporal signal ``exactcall.decide`` carrying the sha256 of its
canonical arguments. These functions send decisions and read pending calls; the ``exactcall``
CLI is a thin layer over them.
"""

from exactcall.approvals._binding import (
    APPROVALS_QUERY,
    DECIDE_SIGNAL,
    PENDING_ATTRIBUTE,
    PENDING_MEMO,
    REQUESTED_BY_MEMO,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGrant,
    ApprovalMissing,
    ApprovalRequest,
    ApprovalsView,
    Decision,
    DecisionRecord,
    signed_payload,
)
from exactcall.approvals._client import (
    DecisionResult,
    approve,
    decide,
    deny,
    list_pending,
    load_signing_key,
    pending,
    preapprove,
    view,
)

__all__ = [
    "APPROVALS_QUERY",
    "DECIDE_SIGNAL",
    "PENDING_ATTRIBUTE",
    "PENDING_MEMO",
    "REQUESTED_BY_MEMO",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalGrant",
    "ApprovalMissing",
    "ApprovalRequest",
    "ApprovalsView",
    "Decision",
    "DecisionRecord",
    "DecisionResult",
    "approve",
    "decide",
    "deny",
    "list_pending",
    "load_signing_key",
    "pending",
    "preapprove",
    "signed_payload",
    "view",
]
