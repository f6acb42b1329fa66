"""What an attempt refuses before it does anything: an intent that does not match its own
arguments (an edited history, or a bug), and arguments that are not the ones approved."""

from __future__ import annotations

from exactcall._canonical import args_hash, derive_key
from exactcall._errors import InvalidCall
from exactcall.activities._markers import Markers
from exactcall.approvals._binding import ApprovalMissing
from exactcall.reconciliation._verdicts import reconcile_id

__all__ = ["check_intent"]


def check_intent(m: Markers) -> None:
    """Recompute the hash and the key of the intent about to run; refuse on mismatch."""
    i, info = m.intent, m.info
    expect_hash = args_hash(i.tool, i.args)
    expect_key = derive_key(info.namespace, i.workflow_id, i.step, i.tool, i.tool_version)
    # a call runs in its own workflow, or in the reconciliation of its key (an undo also in
    # the undo workflow of its workflow id: exactcall undo)
    foreign = info.workflow_id not in (i.workflow_id, reconcile_id(i.key))
    foreign = foreign and not m.in_undo_run
    if foreign or i.tool != m.tool.name or (expect_hash, expect_key) != (i.args_hash, i.key):
        raise InvalidCall(
            "the intent handed to this activity does not match its own arguments "
            "(edited history or a bug); nothing was executed",
            **m.fields(expected_hash=expect_hash, expected_key=expect_key),
        )
    _check_approval(m, expect_hash)


def _check_approval(m: Markers, actual_hash: str) -> None:
    """The hash about to run must be the approved hash, if the call needs approval."""
    i = m.intent
    if i.approval is None and not m.tool.needs_approval(i):
        return
    if i.approval is None or i.approval.args_hash != actual_hash:
        approved = i.approval.args_hash if i.approval else None
        m.log.error("approval.mismatch_at_effect", approved_hash=approved)
        raise ApprovalMissing(
            f"{i.tool} {i.step} is about to run args hash {actual_hash}, but the approved "
            f"hash is {approved}; refusing to run it",
            **m.fields(approved_hash=approved),
        )
