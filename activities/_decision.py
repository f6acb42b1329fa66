"""What an attempt of a call does, decided from what earlier attempts and runs left: a pure table.

An attempt learns what it needs one request at a time (the run's claim, the claimant run's
calls, the key's record, ...); ``decide`` says, from what it knows so far, either the next
thing to learn (``Do.CLAIM_RUN``, ``Do.READ_RECORD``, ...) or what the attempt does:

* ``CALL``: call the tool (after the pre-call markers the decision names);
* ``RECORDED``: return the result the record, or the claimant run's history, holds;
* ``UNKNOWN``: the tool may have been called and nothing says how it went: not re-sent, the
  call goes to its reconciliation;
* ``CONFLICT``: the key already ran with other arguments;
* ``STALE``: this attempt's run has closed and another run holds its calls;
* ``FINISH``: the previous attempt ran the tool but could not record it: record it now;
* ``NOT_CALLED`` (a settling attempt) and ``RELEASE`` (cancelled at the call): the tool was
  not called, and the key is free.

Cancellation is one more input (``Facts.cancelled``), known once the pre-call markers are
written. No requests, no clock, no Temporal call here: the attempt (``_runner``) does the I/O
and carries the decision out. The rows are tested one by one in tests/test_decision.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

__all__ = [
    "ABSENT",
    "LEARN",
    "Absent",
    "Claimant",
    "Decision",
    "Do",
    "Facts",
    "Holder",
    "Place",
    "Seen",
    "Source",
    "decide",
    "may_recall",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Do(enum.Enum):
    # what the attempt does
    CALL = "call"
    RECORDED = "recorded"
    UNKNOWN = "unknown"
    CONFLICT = "conflict"
    STALE = "stale"
    FINISH = "finish"
    NOT_CALLED = "not_called"
    RELEASE = "release"
    # what it learns first (each fills one field of Facts)
    CLAIM_RUN = "claim_run"  # -> holder, beaten
    ASK_HOLDER = "ask_holder"  # -> holder (read, not claimed)
    ASK_CLAIMANT = "ask_claimant"  # -> claimant
    CLAIM_RECORD = "claim_record"  # -> record_claimed
    READ_RECORD = "read_record"  # -> record
    RECLAIM = "reclaim"  # -> reclaimed
    READ_AGAIN = "read_again"  # -> record (it must exist now)
    WAIT_DONE = "wait_done"  # -> waited
    CHAIN_DOUBT = "chain_doubt"  # -> chain_doubt


LEARN = frozenset(
    {
        Do.CLAIM_RUN,
        Do.ASK_HOLDER,
        Do.ASK_CLAIMANT,
        Do.CLAIM_RECORD,
        Do.READ_RECORD,
        Do.RECLAIM,
        Do.READ_AGAIN,
        Do.WAIT_DONE,
        Do.CHAIN_DOUBT,
    }
)


class Place(enum.Enum):
    """Which workflow runs the attempt."""

    CALLER = "caller"  # the call's own workflow
    RECONCILIATION = "reconciliation"  # a re-run inside the key's reconciliation
    UNDO_RUN = "undo_run"  # an undo made by `exactcall undo`, in the undo workflow


class Holder(enum.Enum):
    """Who holds the run claim of the call's workflow id."""

    MINE = "mine"  # this attempt's run: the fast path
    OTHER = "other"  # another run: the slow path
    NONE = "none"  # nobody (or a per-call-records run, whose claim names no run)


class Source(enum.Enum):
    """Where a recorded result (or the recorded args hash of a conflict) is."""

    RECORD = "record"
    CLAIMANT = "claimant"
    WAITED = "waited"


@dataclass(frozen=True)
class Seen:
    """What a call's record says (or would say: the claimant's chains write none)."""

    phase: str
    """idle, calling, unknown, done or abandoned."""
    mine: bool = False
    """Its owner is this attempt's chain."""
    same_call: bool = True
    """Its args hash names this attempt's call (``Tool.same_call``)."""
    since: datetime = EPOCH
    """When the key was first claimed."""

    @property
    def final(self) -> bool:
        return self.phase in ("done", "abandoned")


class Absent(enum.Enum):
    ABSENT = "absent"


ABSENT = Absent.ABSENT
"""The key has no record."""


@dataclass(frozen=True)
class Claimant:
    """What the run that holds the claim (and writes no records) did about the key."""

    status: str
    """absent, not_called, done, in_doubt, or open (``_runs.ClaimantCall``)."""
    same_call: bool = True
    """Its recorded args hash, if any, names this attempt's call."""
    since: datetime = EPOCH
    """When its chain of the key was scheduled."""
    why: str = ""
    """Why it may have called the tool (in_doubt)."""


@dataclass(frozen=True)
class Facts:
    """What the attempt knows. The first fields are known before any request; the others are
    None until the decision asks for them (``Do.CLAIM_RUN`` fills ``holder``, ...)."""

    previous_phase: str | None = None
    """This chain's last heartbeat: None, calling, done, released, ..."""
    attempt: int = 1
    place: Place = Place.CALLER
    settling: bool = False
    """The settling attempt of a cancelled activity: it never calls the tool."""
    run_claims: bool = True
    """The plugin claims workflow ids per run (False: per-call records only)."""
    beat_free: bool = False
    """A provider-idempotent tool under run claims: no pre-call marker on its first attempt."""
    undo_step: bool = False
    window: bool | timedelta = False
    """The tool's ``provider_idempotent``: False, True (forever) or how long it dedupes."""
    scheduled_at: datetime = EPOCH
    """When this attempt was scheduled (the ``since`` of its own chain's "calling")."""
    now: datetime = EPOCH

    holder: Holder | None = None
    beaten: bool = False
    """The pre-call heartbeat went with the run's claim."""
    claimant: Claimant | None = None
    record_claimed: bool | None = None
    record: Seen | Absent | None = None
    reclaimed: bool | None = None
    waited: bool | None = None
    """Another chain recorded a final result while this attempt waited."""
    chain_doubt: str | None = None
    """Why this run's own chain may have called the tool ("": it cannot have)."""
    cancelled: str | None = None
    """None until the pre-call markers are written; then why the attempt was cancelled, or
    "" if it was not."""


@dataclass(frozen=True)
class Decision:
    do: Do
    beat: bool = False
    """CALL: the pre-call heartbeat first. CLAIM_RUN, CLAIM_RECORD: alongside the claim."""
    mark: bool = False
    """CALL: the record's "calling" marker first."""
    owns: bool = False
    """CALL: this attempt owns the call (its activity completion is the done marker)."""
    again: bool = False
    """CALL: the tool may have run already; it is re-sent with the same key."""
    fast: bool = False
    """CALL: on the fast path (a retried failure then writes the record)."""
    source: Source | None = None
    """RECORDED, CONFLICT: where the result, or the recorded args hash, is."""
    reason: str = ""
    """UNKNOWN, NOT_CALLED, RELEASE: why."""


def decide(f: Facts) -> Decision:
    """The next step of an attempt that is not read-only."""
    d = _settle(f) if f.settling else _decide(f)
    if d.do is not Do.CALL or f.cancelled is None or not f.cancelled:
        return d
    # cancelled after the pre-call markers, before the tool was called
    if d.again:  # an earlier attempt may have called it: not ours to release
        why = f"cancelled ({f.cancelled}) before an earlier attempt's call was settled"
        return Decision(Do.UNKNOWN, reason=why)
    return Decision(Do.RELEASE, reason=f"cancelled ({f.cancelled}) before the tool was called")


def _decide(f: Facts) -> Decision:
    if f.previous_phase == "done":
        return Decision(Do.FINISH)
    if f.place is Place.RECONCILIATION:  # a re-run by the reconciliation: its record says it all
        return _by_record(f)
    if f.place is Place.UNDO_RUN:  # the run that holds the id may have made it (its history)
        return Decision(Do.ASK_HOLDER) if f.holder is None else _slow(f)
    if not f.run_claims:  # per-call records; the run's claim names no run
        return Decision(Do.CLAIM_RUN) if f.holder is None else _by_record(f)
    first = f.previous_phase is None
    if f.holder is None:  # a provider-idempotent tool's first attempt writes no marker
        return Decision(Do.CLAIM_RUN, beat=first and not (f.beat_free and f.attempt == 1))
    if f.holder is not Holder.MINE:
        return _slow(f)
    if f.undo_step and first:
        # an undo may also be made by `exactcall undo`, outside this run, under the same key:
        # the key's record decides who makes it (and the other gets its result)
        return _by_record(f)
    d = _fast(f)
    return replace(d, fast=True) if d.do is Do.CALL else d


def _fast(f: Facts) -> Decision:
    """The claimant run: no earlier run of its workflow id made calls, so this chain's own
    heartbeats (and the record, written only off the happy path) say everything."""
    own = Seen(phase="calling", mine=True, since=f.scheduled_at)
    if f.beat_free and f.previous_phase is None:
        if f.attempt == 1:  # the fast path with no marker before the call
            return Decision(Do.CALL, owns=True)
        # an earlier attempt called it with no marker, or crashed before: re-send with the
        # same key inside the provider's window, else unknown
        return _maybe_called(f, own)
    if f.beaten:  # nothing earlier in this chain: the pre-call heartbeat is written
        return Decision(Do.CALL, owns=True)
    if f.record is None:
        return Decision(Do.READ_RECORD)
    if f.record is not ABSENT:
        return _by_seen(f, f.record)
    if f.previous_phase == "calling":  # an earlier attempt may have called it
        return _maybe_called(f, own)
    # released earlier, with no record since (retention): never called
    return Decision(Do.CALL, owns=True, beat=True)


def _slow(f: Facts) -> Decision:
    """Any run but the claimant: the records hold what every other run did; the claimant's
    own calls are read from its history and describe."""
    if f.holder is Holder.NONE:
        return _by_record(f)
    c = f.claimant
    if c is None:
        return Decision(Do.ASK_CLAIMANT)
    if c.status == "open":
        if f.place is Place.UNDO_RUN:
            return _by_record(f)  # it makes its undos by the record
        # the claimant is open, so this attempt's own run has closed (one open run per id):
        # the claimant owns the call now; this stale attempt calls nothing
        return Decision(Do.STALE)
    if c.status in ("done", "in_doubt") and not c.same_call:
        return Decision(Do.CONFLICT, source=Source.CLAIMANT)
    if c.status == "done":
        return Decision(Do.RECORDED, source=Source.CLAIMANT)
    if c.status != "in_doubt":  # never called there
        return _by_record(f)
    if f.record is None:
        return Decision(Do.READ_RECORD)
    if f.record is not ABSENT and f.record.final:
        return _by_seen(f, f.record)
    if f.record is ABSENT or f.record.phase != "unknown":
        return _maybe_called(f, Seen(phase="calling", since=c.since), why=c.why)
    return _maybe_called(f, f.record, why=c.why)


def _by_record(f: Facts) -> Decision:
    """The per-call record protocol: claim the key's record, or follow what it says."""
    if f.previous_phase != "calling":  # (else keep what the earlier attempt wrote)
        if f.record_claimed is None:  # the pre-call heartbeat in the same round trip
            return Decision(Do.CLAIM_RECORD, beat=not f.beaten)
        if f.record_claimed:
            return Decision(Do.CALL, owns=True)
    if f.record is None:
        return Decision(Do.READ_RECORD)
    if f.record is ABSENT:  # a record that vanished (retention): claim it anew
        if f.reclaimed is None:
            return Decision(Do.RECLAIM)
        if f.reclaimed:
            return Decision(Do.CALL, owns=True, beat=True)
        return Decision(Do.READ_AGAIN)
    return _by_seen(f, f.record)


def _by_seen(f: Facts, s: Seen) -> Decision:
    if not s.same_call:
        return Decision(Do.CONFLICT, source=Source.RECORD)
    if s.final:
        return Decision(Do.RECORDED, source=Source.RECORD)
    if s.phase == "idle":  # never called: released after a definite failure
        return Decision(Do.CALL, mark=True, beat=True)
    if s.phase == "calling" and s.mine and f.previous_phase != "calling":
        # our own earlier attempt died between claiming the record and its pre-call heartbeat
        return Decision(Do.CALL, beat=True)
    return _maybe_called(f, s)


def _maybe_called(f: Facts, s: Seen, why: str = "") -> Decision:
    """The tool may have run already (this chain or another)."""
    if may_recall(f.window, f.now, s.since):
        return Decision(Do.CALL, mark=True, beat=True, again=True)
    if s.phase != "unknown" and not s.mine:
        # another run's attempt (a reset or a re-run) may still be paying: give it the
        # heartbeat timeout to record its result. An earlier attempt of this same activity
        # gets none: Temporal started this attempt because that one stopped heartbeating,
        # so it is all but surely dead (SIGKILL, OOM: one that is alive and can reach the
        # server keeps heartbeating). One that was only stalled and finishes later leaves
        # its result on the record, and the call, unknown meanwhile, is reconciled: never
        # re-sent. So a crash settles within about heartbeat_timeout + 2 s.
        if f.waited is None:
            return Decision(Do.WAIT_DONE)
        if f.waited:
            return Decision(Do.RECORDED, source=Source.WAITED)
    if why:
        reason = (
            "an attempt of the run that first made this call may have called the tool "
            f"and did not record a result ({why})"
        )
    else:
        reason = (
            "an earlier attempt may have called the tool and did not record a result "
            f"(it crashed or timed out; record phase {s.phase!r})"
        )
    return Decision(Do.UNKNOWN, reason=reason)


def may_recall(window: bool | timedelta, now: datetime, since: datetime) -> bool:
    """A provider-idempotent tool is re-sent with the same key inside its provider's window."""
    if window is False:
        return False
    if isinstance(window, timedelta):
        return now - since < window
    return True


def _settle(f: Facts) -> Decision:
    """The settling attempt of a cancelled activity: what do the markers say? It never calls
    the tool."""
    if f.record is None:
        return Decision(Do.READ_RECORD)
    if f.record is ABSENT:
        # a run that holds its workflow id's claim wrote no record on the happy path: its
        # history says whether an attempt of this chain may have called the tool
        if f.chain_doubt is None:
            return Decision(Do.CHAIN_DOUBT)
        if f.chain_doubt:
            why = "the call was cancelled while an earlier attempt may have called the tool"
            return Decision(Do.UNKNOWN, reason=f"{why} ({f.chain_doubt})")
        return Decision(Do.NOT_CALLED, reason="its key is free")
    s = f.record
    mine = s.same_call and (s.final or s.mine)
    if not mine:
        return Decision(Do.NOT_CALLED, reason="another run holds its key")
    if s.phase == "idle":
        return Decision(Do.NOT_CALLED, reason="its key is free")
    if s.final:
        return Decision(Do.RECORDED, source=Source.RECORD)
    why = (
        "the call was cancelled while an earlier attempt may have called the tool (it "
        f"crashed or timed out; record phase {s.phase!r})"
    )
    return Decision(Do.UNKNOWN, reason=why)
