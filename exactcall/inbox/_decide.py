"""A decision sent from a page: bound to the args hash that page showed.

Uses the same client code as ``exactcall approve``/``deny`` (``exactcall.approvals``). Before
sending, the call is read again: a call that is no longer pending, or whose arguments hash to
something else than the page showed, gets a clear answer and nothing is sent. What is sent
carries the shown hash, so a change between that read and the signal is still refused by the
workflow, which is the one place that decides (first decision wins, hash must match).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from temporalio.client import Client

from exactcall.approvals import (
    ApprovalRequest,
    ApprovalsView,
    Decision,
    decide,
    signed_payload,
    view,
)
from exactcall.evidence._audit import AuditFilter, audit_rows

__all__ = [
    "Answer",
    "BrowserSignature",
    "decide_from_page",
    "gone",
    "last_outcome",
    "payload_for",
]

SIGNING_HINT = (
    "This worker requires signed decisions. Choose your key file ({name}.key.pem) on the "
    "call's page to sign in this browser; or the inbox signs with your key when its operator "
    "has placed it (exactcall inbox --keys-dir DIR, file DIR/{name}.key.pem); or approve from "
    "a terminal that holds your key: exactcall approve {wf} {step} --hash {h} --as {name} "
    "--key {name}.key.pem"
)


@dataclass(frozen=True)
class Answer:
    """What the page tells the approver after a decision."""

    accepted: bool
    title: str
    detail: str
    sent: bool


async def decide_from_page(
    client: Client,
    workflow_id: str,
    step: str,
    shown_hash: str,
    verdict: Literal["approve", "deny"],
    who: str,
    reason: str | None,
    signing_key: Any = None,
    browser_signature: str | None = None,
) -> Answer:
    """``browser_signature``: the base64 signature the page made in the browser over this
    decision's bytes (``payload_for``); else ``signing_key`` signs, if any."""
    v = await view(client, workflow_id)
    req = next((r for r in v.pending if r.step == step), None)
    if req is None:
        said = await gone(client, workflow_id, step, v)
        return Answer(False, "Not waiting any more", f"{said}. Nothing was sent.", False)
    if req.args_hash != shown_hash:
        return Answer(
            False,
            "The call changed",
            f"Its arguments now hash to {req.args_hash}, not {shown_hash} as your page showed. "
            "Nothing was sent: read the call again before deciding.",
            False,
        )
    if datetime.now(UTC) > req.expires_at:
        return Answer(
            False,
            "Expired",
            f"It expired at {req.expires_at:%Y-%m-%d %H:%M:%S} UTC. Nothing was sent.",
            False,
        )
    if browser_signature:
        try:
            signing_key = BrowserSignature(payload_for(req, verdict, who), browser_signature)
        except ValueError as exc:
            return Answer(False, "Not signed", str(exc), False)
    res = await decide(
        client,
        workflow_id,
        verdict,
        args_hash=shown_hash,
        step=step,
        by=who,
        reason=reason or None,
        expires_at=req.expires_at,
        signing_key=signing_key,
    )
    if res.accepted:
        return Answer(
            True,
            res.outcome[:1].upper() + res.outcome[1:],
            f"{verdict} by {who}, recorded by the workflow.",
            True,
        )
    if res.record is None:
        return Answer(False, "Sent, not confirmed", f"{res.outcome}: look again in a moment.", True)
    detail = f"The workflow refused it: {res.outcome}. Nothing ran because of it."
    if res.outcome.startswith(("unsigned", "signature")):
        detail += " " + SIGNING_HINT.format(name=who, wf=workflow_id, step=step, h=shown_hash)
    return Answer(False, "Refused", detail, True)


def last_outcome(v: ApprovalsView, step: str) -> str:
    """What became of a call that no longer waits, from its accepted decisions."""
    done = [r for r in v.decisions if r.accepted and r.decision.step == step]
    if not done:
        return "It no longer waits: it expired, was cancelled, or its workflow moved on"
    d = done[-1].decision
    why = f" ({d.reason})" if d.reason else ""
    return f"It was already decided: {done[-1].outcome} by {d.by}{why}"


async def gone(client: Client, workflow_id: str, step: str, v: ApprovalsView) -> str:
    """What became of a call that no longer waits: its decision, else its audit row (expired,
    cancelled, ...). Reads the run's history: for a page's answer, not for polling."""
    said = last_outcome(v, step)
    if not said.startswith("It no longer waits"):
        return said
    async for row in audit_rows(client, AuditFilter(workflow=workflow_id)):
        if row["step"] == step:
            error = f" ({row['error']})" if row["error"] else ""
            return f"It no longer waits: {row['outcome']}{error}"
    return said


class BrowserSignature:
    """A signature the approver's browser made (WebCrypto Ed25519, with a key file it read
    locally), handed to ``decide`` in place of a key: ``decide`` asks it to sign the decision's
    bytes, and it gives the browser's signature if the browser signed exactly those bytes."""

    def __init__(self, signed: bytes, signature_b64: str) -> None:
        try:
            self.signature = base64.b64decode(signature_b64, validate=True)
        except ValueError as exc:
            raise ValueError("the page's signature is not base64: nothing was sent") from exc
        self.signed = signed

    def sign(self, payload: bytes) -> bytes:
        if payload != self.signed:
            raise ValueError("the browser signed other bytes than this decision's")
        return self.signature


def payload_for(req: ApprovalRequest, verdict: Literal["approve", "deny"], who: str) -> bytes:
    """What a signature of ``who``'s ``verdict`` on ``req`` covers (as ``decide`` signs it)."""
    d = Decision(
        decision=verdict, args_hash=req.args_hash, step=req.step, by=who, expires_at=req.expires_at
    )
    return signed_payload(req.workflow_id, d)
