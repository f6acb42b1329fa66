"""Approvals bound to the exact arguments of a call: models and the per-workflow book.

Pure and deterministic (runs inside workflows). A decision is a Temporal signal
(``exactcall.decide``) whose payload names the call (workflow, step) and carries the sha256 of
its canonical arguments; a decision whose hash differs from the pending call's is rejected and
recorded, and the call stays pending. The first final decision wins: once a call is approved,
a later deny is rejected as "already approved" (the call may already be running), and once it
is denied or expired nothing can approve it. A call whose caller was cancelled while it waited
is no longer pending; a later decision is rejected as "not pending".

Signed decisions (optional): when the worker knows approvers' Ed25519 public keys, a decision
must carry a signature by the key of its ``by`` over the canonical JSON of
``{"workflow_id", "step", "args_hash", "decision", "expires_at"}``, so it cannot be replayed
onto another call.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from exactcall._canonical import canonical_json
from exactcall._errors import ExactcallError, register_error
from exactcall._model import FROZEN, ApprovalGrant, CallIdentity
from exactcall._wire import APPROVALS_QUERY
from exactcall._wire import DECIDE_SIGNAL as DECIDE_SIGNAL
from exactcall._wire import PENDING_ATTRIBUTE as PENDING_ATTRIBUTE
from exactcall._wire import PENDING_MEMO as PENDING_MEMO
from exactcall._wire import REQUESTED_BY_MEMO as REQUESTED_BY_MEMO

__all__ = [
    "APPROVALS_QUERY",
    "DECIDE_SIGNAL",
    "PENDING_ATTRIBUTE",
    "PENDING_MEMO",
    "ApprovalBook",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalGrant",
    "ApprovalRequest",
    "ApprovalsView",
    "Decision",
    "DecisionRecord",
    "signed_payload",
]


@register_error
class ApprovalDenied(ExactcallError):
    """A person denied the call; nothing ran."""

    code = "ApprovalDenied"


@register_error
class ApprovalExpired(ExactcallError):
    """Nobody approved the call before its deadline; nothing ran."""

    code = "ApprovalExpired"


@register_error
class ApprovalMissing(ExactcallError):
    """The activity was about to run a call needing approval without a matching one."""

    code = "ApprovalMissing"


class ApprovalRequest(CallIdentity):
    """A call waiting for a person: exactly what would run."""

    requested_at: datetime
    expires_at: datetime
    requested_by: str | None = None
    approvals_needed: int = 1
    approved_by: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    """Why it waits besides the tool's own rule (a budget it would pass)."""


class Decision(BaseModel):
    """The payload of the ``exactcall.decide`` signal.

    ``step`` None with ``tool`` set is a pre-approval: it is kept and consumed by the first
    call of that tool whose args hash matches. ``decision_id`` lets the sender find its
    outcome by query.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["approve", "deny"]
    args_hash: str
    step: str | None = None
    tool: str | None = None
    by: str
    reason: str | None = None
    decision_id: str | None = None
    expires_at: datetime | None = None
    signature: str | None = None


class DecisionRecord(BaseModel):
    """What became of one decision: accepted, or rejected and why."""

    model_config = FROZEN

    decision: Decision
    accepted: bool
    outcome: str
    at: datetime


class ApprovalsView(BaseModel):
    """Answer of the ``exactcall.approvals`` query."""

    model_config = FROZEN

    pending: list[ApprovalRequest]
    decisions: list[DecisionRecord]
    preapprovals: list[Decision]


def signed_payload(workflow_id: str, d: Decision) -> bytes:
    """The bytes an approver signs: binds the decision to one call and one deadline."""
    return canonical_json(
        {
            "workflow_id": workflow_id,
            "step": d.step,
            "args_hash": d.args_hash,
            "decision": d.decision,
            "expires_at": d.expires_at.isoformat() if d.expires_at else None,
        }
    )


Verifier = Callable[[str, bytes, bytes], bool]
"""(approver name, payload, signature) -> whether the signature is valid."""


@dataclass
class _Open:
    request: ApprovalRequest
    approvers: frozenset[str] | None
    requester_may_approve: bool
    older_hashes: frozenset[str] = frozenset()
    """Hashes the same call had before its tool gained parameters it leaves at their defaults
    (``Tool.older_hashes``): a decision made before such a deploy still names this call."""
    state: Literal["pending", "approved", "denied", "expired", "cancelled"] = "pending"
    reasons: list[str] = field(default_factory=list)
    decided_at: datetime | None = None


@dataclass
class ApprovalBook:
    """Pending requests, decisions and pre-approvals of one workflow run."""

    workflow_id: str
    verifier: Verifier | None = None
    open: dict[str, _Open] = field(default_factory=dict)
    decisions: list[DecisionRecord] = field(default_factory=list)
    preapprovals: list[Decision] = field(default_factory=list)

    # -- requests ------------------------------------------------------------------------
    def request(
        self,
        req: ApprovalRequest,
        approvers: frozenset[str] | None,
        requester_may_approve: bool,
        now: datetime,
        older_hashes: frozenset[str] = frozenset(),
    ) -> None:
        self.open[req.step] = _Open(req, approvers, requester_may_approve, older_hashes)
        for pre in list(self.preapprovals):
            if self._preapproval_fits(pre, req, older_hashes):
                self.preapprovals.remove(pre)
                self._apply(self.open[req.step], pre, now, consumed_preapproval=True)
                break

    def state(self, step: str) -> str:
        return self.open[step].state

    def expire(self, step: str, now: datetime) -> None:
        o = self.open[step]
        if o.state == "pending":
            o.state = "expired"
            o.decided_at = now

    def cancel(self, step: str, now: datetime) -> None:
        """The call stopped waiting (its caller or workflow was cancelled): no longer pending,
        and no later decision applies to it."""
        o = self.open[step]
        if o.state == "pending":
            o.state = "cancelled"
            o.decided_at = now

    def grant(self, step: str) -> ApprovalGrant:
        o = self.open[step]
        if o.state != "approved" or o.decided_at is None:  # a caller's bug: fail the workflow
            raise ApprovalMissing(f"step {step!r} is {o.state}, not approved: no grant", step=step)
        return ApprovalGrant(
            args_hash=o.request.args_hash,
            approved_by=o.request.approved_by,
            reasons=tuple(o.reasons),
            decided_at=o.decided_at,
        )

    def pending(self) -> list[ApprovalRequest]:
        return [o.request for o in self.open.values() if o.state == "pending"]

    def view(self) -> ApprovalsView:
        return ApprovalsView(
            pending=self.pending(), decisions=list(self.decisions), preapprovals=self.preapprovals
        )

    # -- decisions -----------------------------------------------------------------------
    def decide(self, d: Decision, now: datetime) -> DecisionRecord:
        """Apply a decision signal; every decision is recorded, accepted or not."""
        why = self._refusal(d)
        if why is not None:
            return self._record(d, False, why, now)
        if d.step is None or d.step not in self.open:
            if d.decision != "approve":
                return self._record(d, False, "no pending call to deny", now)
            if d.tool is None and d.step is None:
                return self._record(d, False, "a pre-approval must name the tool", now)
            self.preapprovals.append(d)
            return self._record(d, True, "pre-approval kept until the call is reached", now)
        return self._apply(self.open[d.step], d, now)

    def _apply(
        self, o: _Open, d: Decision, now: datetime, consumed_preapproval: bool = False
    ) -> DecisionRecord:
        req = o.request
        if o.state == "cancelled":
            return self._record(d, False, "not pending: the call was cancelled; nothing ran", now)
        if o.state != "pending":
            return self._record(d, False, f"already {o.state}", now)
        if now > req.expires_at:
            self.expire(req.step, now)
            return self._record(d, False, "expired", now)
        if d.args_hash != req.args_hash and d.args_hash not in o.older_hashes:
            return self._record(
                d, False, f"hash mismatch: the pending call's args hash is {req.args_hash}", now
            )
        if d.expires_at is not None and d.expires_at != req.expires_at and not consumed_preapproval:
            return self._record(d, False, "the decision names another deadline", now)
        if d.decision == "deny":
            o.state, o.decided_at = "denied", now
            o.reasons.append(d.reason or f"denied by {d.by}")
            return self._record(d, True, "denied", now)
        if o.approvers is not None and d.by not in o.approvers:
            return self._record(d, False, f"{d.by} is not an approver of {req.tool}", now)
        if not o.requester_may_approve and req.requested_by == d.by:
            return self._record(d, False, "the requester may not approve their own call", now)
        if d.by in req.approved_by:
            return self._record(d, False, f"{d.by} already approved", now)
        req = req.model_copy(update={"approved_by": (*req.approved_by, d.by)})
        o.request = req
        if d.reason:
            o.reasons.append(d.reason)
        if len(req.approved_by) < req.approvals_needed:
            n = f"{len(req.approved_by)} of {req.approvals_needed}"
            return self._record(d, True, f"approval {n} recorded", now)
        o.state, o.decided_at = "approved", now
        how = "approved (pre-approval)" if consumed_preapproval else "approved"
        return self._record(d, True, how, now)

    def _refusal(self, d: Decision) -> str | None:
        if self.verifier is None:
            return None
        if not d.signature:
            return "unsigned: this worker requires signed decisions"
        try:
            sig = base64.b64decode(d.signature, validate=True)
        except ValueError:
            return "bad signature encoding"
        if not self.verifier(d.by, signed_payload(self.workflow_id, d), sig):
            return f"signature does not verify with {d.by}'s key"
        return None

    @staticmethod
    def _preapproval_fits(pre: Decision, req: ApprovalRequest, older: frozenset[str]) -> bool:
        if pre.args_hash != req.args_hash and pre.args_hash not in older:
            return False
        if pre.step is not None:
            return pre.step == req.step
        return pre.tool == req.tool

    def _record(self, d: Decision, accepted: bool, outcome: str, now: datetime) -> DecisionRecord:
        rec = DecisionRecord(decision=d, accepted=accepted, outcome=outcome, at=now)
        self.decisions.append(rec)
        return rec


def ed25519_verifier(keys: Mapping[str, Any]) -> Verifier:
    """A verifier over approvers' Ed25519 public keys (PEM/raw bytes or key objects)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    loaded: dict[str, Ed25519PublicKey] = {}
    for name, key in keys.items():
        if isinstance(key, Ed25519PublicKey):
            loaded[name] = key
        elif isinstance(key, bytes | str) and b"BEGIN" in (
            key.encode() if isinstance(key, str) else key
        ):
            k = load_pem_public_key(key.encode() if isinstance(key, str) else key)
            if not isinstance(k, Ed25519PublicKey):
                raise TypeError(f"approver {name!r}: not an Ed25519 public key")
            loaded[name] = k
        else:
            loaded[name] = Ed25519PublicKey.from_public_bytes(bytes(key))
    _refuse_shared_keys(loaded)

    def verify(name: str, payload: bytes, sig: bytes) -> bool:
        key = loaded.get(name)
        if key is None:
            return False
        try:
            key.verify(sig, payload)
        except InvalidSignature:
            return False
        return True

    return verify


def _refuse_shared_keys(keys: Mapping[str, Any]) -> None:
    """One key under two approver names would let one person give both approvals of a
    2-of-N, or approve as someone else: refuse it when the plugin is built."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    owners: dict[bytes, str] = {}
    for name, key in keys.items():
        raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
        if raw in owners:
            raise ValueError(
                f"approver_keys: {owners[raw]!r} and {name!r} have the same public key; each "
                "approver needs a key of their own (min_approvals counts distinct people only "
                "when their keys are distinct)"
            )
        owners[raw] = name


def unsigned_identity_warnings(tools: Sequence[Any], signed: bool) -> list[str]:
    """What ``approvers=``, ``min_approvals=`` and ``requester_may_approve=False`` cannot
    guarantee without signed approvals: each names a tool and the option that relies on a name
    anyone can type (``--as``). Empty when decisions are signed."""
    if signed:
        return []
    out = []
    for t in tools:
        o = t.options
        relies = [
            label
            for label, on in (
                ("approvers=", o.approvers is not None),
                (f"min_approvals={o.min_approvals}", o.min_approvals > 1),
                ("requester_may_approve=False", not o.requester_may_approve),
            )
            if on
        ]
        if relies:
            out.append(
                f"tool {t.name}: {', '.join(relies)} checks approver names, which are not "
                "verified without signed approvals (anyone can pass --as another name, and one "
                "person can give two approvals); pass exactcall.Plugin(approver_keys={...})"
            )
    return out
