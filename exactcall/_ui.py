"""What the Temporal UI shows the person on call: summaries, details and current details.

Pure text (Temporal's markdown) built from intents and pending requests, deterministic, so
workflows and activities alike can call it:

* a call record (``exactcall-call-<key>``) and a reconciliation (``exactcall-reconcile-<key>``)
  get a one-line ``static_summary`` ("pay pay#1 of workflow X, args a026bd65…") and the
  intent as ``static_details``;
* a workflow whose calls wait for a person shows, as its current details, every pending call
  with its exact canonical arguments, hash, expiry and the ``exactcall approve`` / ``deny``
  commands; a parked reconciliation shows why and the ``exactcall resolve`` commands.

Temporal caps a summary at 400 bytes and details at 20,000 (of their JSON payloads): texts
are cut to fit, and cut arguments name the command that prints them whole.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from exactcall._model import Intent
from exactcall._wire import (
    RECONCILE_WORKFLOW,
    RECORD_WORKFLOW,
    RUN_CLAIM_WORKFLOW,
    UNRESOLVED_ATTRIBUTE,
)
from exactcall.approvals._binding import PENDING_ATTRIBUTE, ApprovalRequest

__all__ = [
    "DETAILS_LIMIT",
    "PENDING_MARK",
    "RECORD_WORKFLOW",
    "RUN_CLAIM_WORKFLOW",
    "SAVED_VIEWS",
    "SUMMARY_LIMIT",
    "call_summary",
    "claim_summary",
    "intent_details",
    "parked_details",
    "pending_details",
    "with_pending",
]

SUMMARY_LIMIT = 400
DETAILS_LIMIT = 20_000
PENDING_MARK = "### exactcall: "
"""Starts exactcall's section of a workflow's current details (what precedes it is the
workflow's own and is kept)."""

_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./#-]+")


def _size(text: str) -> int:
    """Bytes of ``text`` as a JSON payload (the most any JSON converter writes)."""
    return len(json.dumps(text))


def _arg(value: str) -> str:
    """A shell word: as is when it is safe to paste, quoted otherwise."""
    if _SAFE.fullmatch(value) and not value.startswith(("#", "-")):
        return value
    return shlex.quote(value)


def _ns(namespace: str) -> list[str]:
    return [] if namespace == "default" else ["--namespace", _arg(namespace)]


def _at(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _sh(words: Sequence[str]) -> str:
    """A command (shell words) as a markdown code block; a long one has each option on a
    continuation line (the UI's panels are narrow; the pasted block runs as one command)."""
    if len(" ".join(words)) <= 72:
        return f"```sh\n{' '.join(words)}\n```"
    lines: list[list[str]] = [[]]
    for w in words:
        if w.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(w)
    body = " \\\n  ".join(" ".join(line) for line in lines)
    return f"```sh\n{body}\n```"


# -- summaries and static details ------------------------------------------------------------
def call_summary(intent: Intent, prefix: str = "") -> str:
    """One line: ``[prefix]tool step of workflow X, args <hash>…``, the workflow id cut to fit
    Temporal's limit."""
    tail = f", args {intent.args_hash[:8]}…"
    wid = intent.workflow_id
    text = f"{prefix}{intent.tool} {intent.step} of workflow {wid}{tail}"
    while _size(text) > SUMMARY_LIMIT and wid:
        wid = wid[: len(wid) // 2]
        text = f"{prefix}{intent.tool} {intent.step} of workflow {wid}…{tail}"
    return text if _size(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT // 6]


def claim_summary(workflow_id: str, run_id: str) -> str:
    """One line for a workflow id's run claim: which run may make calls without per-call
    records (none: ``run_id`` is empty), the workflow id cut to fit."""
    who = f"run {run_id}" if run_id else "no run (per-call records)"
    wid = workflow_id
    text = f"run claim of workflow {wid}: {who}"
    while _size(text) > SUMMARY_LIMIT and wid:
        wid = wid[: len(wid) // 2]
        text = f"run claim of workflow {wid}…: {who}"
    return text if _size(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT // 6]


def intent_details(intent: Intent, what: str, extra: Sequence[str] = ()) -> str:
    """The intent as markdown: what the call is, its key, hash and exact arguments."""
    head = "\n".join(
        [
            f"**{what}** of `{intent.tool} {intent.step}`",
            "",
            f"- **tool** `{intent.tool}` (version {intent.tool_version})",
            f"- **step** `{intent.step}`",
            f"- **workflow** `{intent.workflow_id}` ({intent.workflow_type}, namespace "
            f"{intent.namespace})",
            f"- **idempotency key** `{intent.key}`"
            + (" (explicit)" if intent.explicit_key else ""),
            f"- **args hash** `{intent.args_hash}`",
            *extra,
        ]
    )
    budget = DETAILS_LIMIT - _size(head) - 200
    return head + "\n\n" + _args_block(intent.args, budget, "this workflow's input")


def _args_block(args: dict[str, Any], budget: int, whole: str) -> str:
    """The canonical arguments as pretty JSON, or a note when they do not fit ``budget``."""
    pretty = json.dumps(args, indent=2, sort_keys=True, ensure_ascii=False)
    block = f"Arguments (canonical JSON):\n\n```json\n{pretty}\n```"
    if _size(block) <= budget:
        return block
    return (
        f"Arguments: {len(pretty)} characters of canonical JSON, too long to show here "
        f"({whole} holds them)."
    )


# -- calls waiting for approval --------------------------------------------------------------
def _decide_words(req: ApprovalRequest, verb: str, namespace: str) -> list[str]:
    words = ["exactcall", verb, _arg(req.workflow_id), _arg(req.step), "--hash", req.args_hash]
    if verb == "deny":
        words += ["--reason", '"..."']
    return words + _ns(namespace)


def pending_details(pending: Sequence[ApprovalRequest], namespace: str = "default") -> str:
    """Markdown listing every pending call of a workflow ("" when none is pending)."""
    if not pending:
        return ""
    n = len(pending)
    head = f"{PENDING_MARK}{n} call{'s' if n > 1 else ''} awaiting approval"
    budget = DETAILS_LIMIT // n - 1500
    return "\n\n".join([head, *(_pending_one(r, namespace, budget) for r in pending)])


def _pending_one(req: ApprovalRequest, namespace: str, budget: int) -> str:
    facts = [
        f"#### `{req.step}`: {req.tool}",
        "",
        f"- **args hash** `{req.args_hash}`",
        f"- **expires** {_at(req.expires_at)} (requested {_at(req.requested_at)})",
    ]
    if req.requested_by:
        facts.append(f"- **requested by** {req.requested_by}")
    if req.approvals_needed > 1:
        facts.append(f"- **needs** {req.approvals_needed} approvals, by different people")
    show = f"`exactcall approvals show {_arg(req.workflow_id)} {_arg(req.step)}`"
    return "\n".join(
        [
            *facts,
            "",
            _args_block(req.args, budget, show),
            "",
            "Approve exactly these arguments:",
            "",
            _sh(_decide_words(req, "approve", namespace)),
            "",
            "Deny:",
            "",
            _sh(_decide_words(req, "deny", namespace)),
        ]
    )


def with_pending(current: str, section: str) -> str:
    """The workflow's current details with exactcall's section replaced by ``section``.

    What the workflow set itself (before exactcall's section) is kept."""
    at = current.find(PENDING_MARK)
    own = (current if at < 0 else current[:at]).rstrip()
    if not section:
        return own
    return f"{own}\n\n{section}" if own else section


# -- parked calls ----------------------------------------------------------------------------
def _resolve_words(intent: Intent, namespace: str) -> list[list[str]]:
    base = ["exactcall", "resolve", _arg(intent.workflow_id), _arg(intent.step)]
    ns = _ns(namespace)
    return [
        [*base, "--landed", "--result", "'<its result as JSON>'", *ns],
        [*base, "--not-landed", *ns],
        [*base, "--abandon", "--reason", '"..."', *ns],
    ]


def parked_details(intent: Intent, reason: str, since: datetime, cancelled: bool) -> str:
    """Markdown for a parked reconciliation: why, and how a person settles it."""
    landed, not_landed, abandon = _resolve_words(intent, intent.namespace)
    again = (
        "it did not happen: the call was cancelled, so its key is released (it is not re-run)"
        if cancelled
        else "it did not happen: run it once more with the same key"
    )
    head = "\n".join(
        [
            f"{PENDING_MARK}unresolved: the outcome of `{intent.tool} {intent.step}` is unknown",
            "",
            f"- **why** {reason}",
            f"- **workflow** `{intent.workflow_id}`",
            f"- **since** {_at(since)}",
            f"- **args hash** `{intent.args_hash}`",
            f"- **idempotency key** `{intent.key}`",
            "",
            "Check the destination for an effect under that key, then resolve it:",
            "",
            _sh(landed),
            "it happened: the call returns that result (as the tool would have; `null` for none);",
            "",
            _sh(not_landed),
            f"{again};",
            "",
            _sh(abandon),
            "give up: the call fails with CallAbandoned.",
        ]
    )
    budget = DETAILS_LIMIT - _size(head) - 200
    return head + "\n\n" + _args_block(intent.args, budget, "`exactcall unresolved --json`")


# -- saved views -----------------------------------------------------------------------------

SAVED_VIEWS = {
    "Awaiting approval": f"{PENDING_ATTRIBUTE} = true AND ExecutionStatus = 'Running'",
    "Parked calls": f"{UNRESOLVED_ATTRIBUTE} = true AND ExecutionStatus = 'Running'",
    "My workflows": (
        f"WorkflowType != '{RECORD_WORKFLOW}' AND WorkflowType != '{RECONCILE_WORKFLOW}' "
        f"AND WorkflowType != '{RUN_CLAIM_WORKFLOW}'"
    ),
}
"""Visibility queries for the Temporal UI's saved views: calls waiting for a person, calls
parked for a verdict, and the user's own workflows without exactcall's records and
reconciliations. ``ExecutionStatus = 'Running'``: a workflow terminated while it waited keeps
its last search attribute values."""
