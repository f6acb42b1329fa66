"""The attempt's decision table (activities/_decision.py), row by row, with no server: what an
attempt does given what earlier attempts and runs left (issue 34 §2). The last test checks
that the rows reach every ``return`` of the table, so a branch added without a row fails."""

from __future__ import annotations

import ast
import inspect
import sys
from dataclasses import replace
from datetime import timedelta
from types import FrameType
from typing import Any

import pytest

from exactcall.activities import _decision
from exactcall.activities._decision import (
    ABSENT,
    EPOCH,
    LEARN,
    Claimant,
    Decision,
    Do,
    Facts,
    Holder,
    Place,
    Seen,
    Source,
    decide,
    may_recall,
)

NOW = EPOCH + timedelta(hours=1)
RECENT = NOW - timedelta(seconds=5)
WINDOW = timedelta(minutes=1)

CALLER = Facts(now=NOW)
"""A first attempt in the call's own workflow, under run claims, of a tool with no provider
idempotency."""
FAST = replace(CALLER, previous_phase="calling", holder=Holder.MINE)
"""The claimant run, after an attempt that wrote its pre-call heartbeat."""
SLOW = replace(CALLER, holder=Holder.OTHER)
DOUBT = replace(SLOW, claimant=Claimant(status="in_doubt", since=RECENT, why="it was running"))
BY_RECORD = replace(CALLER, place=Place.RECONCILIATION)
LOST = replace(BY_RECORD, record_claimed=False)
"""The per-call protocol, after another chain claimed the record."""
SETTLING = replace(CALLER, settling=True)

CALLING = Seen(phase="calling", since=RECENT)
MINE = Seen(phase="calling", mine=True, since=RECENT)
DONE = Seen(phase="done", since=RECENT)

Row = tuple[str, Facts, Decision, str]
ROWS: list[Row] = [
    # -- where the attempt starts
    ("previous attempt ran, record missing", replace(CALLER, previous_phase="done"),
     Decision(Do.FINISH), ""),
    ("in the reconciliation: the record", BY_RECORD, Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("exactcall undo: who holds the id", replace(CALLER, place=Place.UNDO_RUN),
     Decision(Do.ASK_HOLDER), ""),
    ("exactcall undo, nobody holds the id",
     replace(CALLER, place=Place.UNDO_RUN, holder=Holder.NONE),
     Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("per-call records: a claim naming no run", replace(CALLER, run_claims=False),
     Decision(Do.CLAIM_RUN), ""),
    ("per-call records, then the record",
     replace(CALLER, run_claims=False, holder=Holder.NONE),
     Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("first attempt: run claim with the pre-call heartbeat", CALLER,
     Decision(Do.CLAIM_RUN, beat=True), ""),
    ("beat-free first attempt: run claim alone", replace(CALLER, beat_free=True, window=True),
     Decision(Do.CLAIM_RUN), ""),
    ("retry after calling: run claim alone", replace(CALLER, previous_phase="calling"),
     Decision(Do.CLAIM_RUN), ""),
    ("undo step in its own run: by the record",
     replace(CALLER, holder=Holder.MINE, beaten=True, undo_step=True),
     Decision(Do.CLAIM_RECORD), ""),
    # -- the fast path (this run holds the claim)
    ("fast, beat-free first attempt",
     replace(CALLER, holder=Holder.MINE, beat_free=True, window=True),
     Decision(Do.CALL, owns=True, fast=True), ""),
    ("fast, beat-free retry inside the window",
     replace(CALLER, attempt=2, holder=Holder.MINE, beat_free=True, window=WINDOW,
             scheduled_at=RECENT),
     Decision(Do.CALL, mark=True, beat=True, again=True, fast=True), ""),
    ("fast, beat-free retry past the window",
     replace(CALLER, attempt=2, holder=Holder.MINE, beat_free=True, window=WINDOW),
     Decision(Do.UNKNOWN), "record phase 'calling'"),
    ("fast, heartbeat went with the claim", replace(CALLER, holder=Holder.MINE, beaten=True),
     Decision(Do.CALL, owns=True, fast=True), ""),
    ("fast retry: read the record", FAST, Decision(Do.READ_RECORD), ""),
    ("fast retry, record done", replace(FAST, record=DONE),
     Decision(Do.RECORDED, source=Source.RECORD), ""),
    ("fast retry after calling, no record", replace(FAST, record=ABSENT),
     Decision(Do.UNKNOWN), "record phase 'calling'"),
    ("fast retry after a release, no record (retention)",
     replace(FAST, previous_phase="released", record=ABSENT),
     Decision(Do.CALL, owns=True, beat=True, fast=True), ""),
    # -- the slow path (another run holds the claim)
    ("slow: ask the claimant", SLOW, Decision(Do.ASK_CLAIMANT), ""),
    ("slow, claimant open: this run closed", replace(SLOW, claimant=Claimant(status="open")),
     Decision(Do.STALE), ""),
    ("exactcall undo, claimant open: by the record",
     replace(SLOW, place=Place.UNDO_RUN, claimant=Claimant(status="open")),
     Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("slow, claimant did it with other args",
     replace(SLOW, claimant=Claimant(status="done", same_call=False)),
     Decision(Do.CONFLICT, source=Source.CLAIMANT), ""),
    ("slow, claimant in doubt with other args",
     replace(SLOW, claimant=Claimant(status="in_doubt", same_call=False)),
     Decision(Do.CONFLICT, source=Source.CLAIMANT), ""),
    ("slow, claimant did it", replace(SLOW, claimant=Claimant(status="done")),
     Decision(Do.RECORDED, source=Source.CLAIMANT), ""),
    ("slow, claimant never called it", replace(SLOW, claimant=Claimant(status="not_called")),
     Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("slow, claimant never scheduled it", replace(SLOW, claimant=Claimant(status="absent")),
     Decision(Do.CLAIM_RECORD, beat=True), ""),
    ("slow, claimant in doubt: read the record", DOUBT, Decision(Do.READ_RECORD), ""),
    ("slow, in doubt, record done", replace(DOUBT, record=DONE),
     Decision(Do.RECORDED, source=Source.RECORD), ""),
    ("slow, in doubt, record done with other args",
     replace(DOUBT, record=replace(DONE, same_call=False)),
     Decision(Do.CONFLICT, source=Source.RECORD), ""),
    ("slow, in doubt, no record: wait for the claimant's chain", replace(DOUBT, record=ABSENT),
     Decision(Do.WAIT_DONE), ""),
    ("slow, in doubt, it recorded meanwhile", replace(DOUBT, record=ABSENT, waited=True),
     Decision(Do.RECORDED, source=Source.WAITED), ""),
    ("slow, in doubt, nothing recorded", replace(DOUBT, record=ABSENT, waited=False),
     Decision(Do.UNKNOWN), "the run that first made this call may have called the tool and did "
     "not record a result (it was running)"),
    ("slow, in doubt, record unknown",
     replace(DOUBT, record=Seen(phase="unknown", since=RECENT)),
     Decision(Do.UNKNOWN), "(it was running)"),
    ("slow, in doubt, provider-idempotent inside the window",
     replace(DOUBT, record=ABSENT, window=WINDOW),
     Decision(Do.CALL, mark=True, beat=True, again=True), ""),
    # -- the per-call record protocol
    ("record claimed", replace(BY_RECORD, record_claimed=True), Decision(Do.CALL, owns=True), ""),
    ("record claimed, heartbeat went with the run claim",
     replace(BY_RECORD, beaten=True), Decision(Do.CLAIM_RECORD), ""),
    ("record held by another chain: read it", LOST, Decision(Do.READ_RECORD), ""),
    ("retry after calling: read, no claim", replace(BY_RECORD, previous_phase="calling"),
     Decision(Do.READ_RECORD), ""),
    ("record vanished (retention): claim anew", replace(LOST, record=ABSENT),
     Decision(Do.RECLAIM), ""),
    ("record claimed anew", replace(LOST, record=ABSENT, reclaimed=True),
     Decision(Do.CALL, owns=True, beat=True), ""),
    ("record claimed anew by another: read again", replace(LOST, record=ABSENT, reclaimed=False),
     Decision(Do.READ_AGAIN), ""),
    ("record has other args", replace(LOST, record=replace(CALLING, same_call=False)),
     Decision(Do.CONFLICT, source=Source.RECORD), ""),
    ("record done", replace(LOST, record=DONE), Decision(Do.RECORDED, source=Source.RECORD), ""),
    ("record abandoned", replace(LOST, record=Seen(phase="abandoned")),
     Decision(Do.RECORDED, source=Source.RECORD), ""),
    ("record released (idle)", replace(LOST, record=Seen(phase="idle")),
     Decision(Do.CALL, mark=True, beat=True), ""),
    ("own record, died before the heartbeat", replace(LOST, record=MINE),
     Decision(Do.CALL, beat=True), ""),
    ("own record after calling", replace(LOST, previous_phase="calling", record=MINE),
     Decision(Do.UNKNOWN), "an earlier attempt may have called the tool"),
    ("another chain is calling: wait for it", replace(LOST, record=CALLING),
     Decision(Do.WAIT_DONE), ""),
    ("another chain recorded meanwhile", replace(LOST, record=CALLING, waited=True),
     Decision(Do.RECORDED, source=Source.WAITED), ""),
    ("another chain recorded nothing", replace(LOST, record=CALLING, waited=False),
     Decision(Do.UNKNOWN), "record phase 'calling'"),
    ("record unknown", replace(LOST, record=Seen(phase="unknown")),
     Decision(Do.UNKNOWN), "record phase 'unknown'"),
    ("another chain is calling, provider-idempotent forever",
     replace(LOST, record=CALLING, window=True),
     Decision(Do.CALL, mark=True, beat=True, again=True), ""),
    # -- the settling attempt of a cancelled activity (never calls)
    ("settling: read the record", SETTLING, Decision(Do.READ_RECORD), ""),
    ("settling, no record: this run's chain", replace(SETTLING, record=ABSENT),
     Decision(Do.CHAIN_DOUBT), ""),
    ("settling, no record, chain may have called",
     replace(SETTLING, record=ABSENT, chain_doubt="its attempt was running"),
     Decision(Do.UNKNOWN),
     "cancelled while an earlier attempt may have called the tool (its attempt was running)"),
    ("settling, no record, chain never called", replace(SETTLING, record=ABSENT, chain_doubt=""),
     Decision(Do.NOT_CALLED), "its key is free"),
    ("settling, record of other args", replace(SETTLING, record=replace(MINE, same_call=False)),
     Decision(Do.NOT_CALLED), "another run holds its key"),
    ("settling, another chain's record", replace(SETTLING, record=CALLING),
     Decision(Do.NOT_CALLED), "another run holds its key"),
    ("settling, own record released", replace(SETTLING, record=replace(MINE, phase="idle")),
     Decision(Do.NOT_CALLED), "its key is free"),
    ("settling, record done", replace(SETTLING, record=DONE),
     Decision(Do.RECORDED, source=Source.RECORD), ""),
    ("settling, own record calling", replace(SETTLING, record=MINE),
     Decision(Do.UNKNOWN), "crashed or timed out; record phase 'calling'"),
    # -- cancellation, known once the pre-call markers are written
    ("call, markers written, not cancelled", replace(BY_RECORD, record_claimed=True, cancelled=""),
     Decision(Do.CALL, owns=True), ""),
    ("call, cancelled before the tool", replace(BY_RECORD, record_claimed=True, cancelled="stop"),
     Decision(Do.RELEASE), "cancelled (stop) before the tool was called"),
    ("re-call, cancelled before the tool",
     replace(LOST, record=CALLING, window=True, cancelled="stop"),
     Decision(Do.UNKNOWN), "cancelled (stop) before an earlier attempt's call was settled"),
    ("cancelled, but not at a call", replace(LOST, cancelled="stop"),
     Decision(Do.READ_RECORD), ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "expected", "why"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_row(facts: Facts, expected: Decision, why: str) -> None:
    got = decide(facts)
    assert replace(got, reason="") == expected
    assert why in got.reason
    assert bool(got.reason) == (expected.do in (Do.UNKNOWN, Do.NOT_CALLED, Do.RELEASE))


FILLS = {
    Do.CLAIM_RUN: "holder",
    Do.ASK_HOLDER: "holder",
    Do.ASK_CLAIMANT: "claimant",
    Do.CLAIM_RECORD: "record_claimed",
    Do.READ_RECORD: "record",
    Do.RECLAIM: "reclaimed",
    Do.WAIT_DONE: "waited",
    Do.CHAIN_DOUBT: "chain_doubt",
}


@pytest.mark.parametrize(("facts", "expected"), [r[1:3] for r in ROWS], ids=[r[0] for r in ROWS])
def test_it_asks_only_what_it_does_not_know(facts: Facts, expected: Decision) -> None:
    """Each question fills a field that was unknown, so an attempt never asks twice (its loop
    ends); READ_AGAIN reads a record that was absent."""
    assert set(FILLS) | {Do.READ_AGAIN} == LEARN
    if expected.do in FILLS:
        assert getattr(facts, FILLS[expected.do]) is None
    if expected.do is Do.READ_AGAIN:
        assert facts.record is ABSENT and facts.reclaimed is False


def test_the_recall_window() -> None:
    assert not may_recall(False, NOW, NOW)
    assert may_recall(True, NOW, EPOCH)
    assert may_recall(WINDOW, NOW, RECENT)
    assert not may_recall(WINDOW, NOW, NOW - WINDOW)


def test_the_rows_reach_every_return_of_the_table() -> None:
    returns = {
        node.lineno
        for node in ast.walk(ast.parse(inspect.getsource(_decision)))
        if isinstance(node, ast.Return)
    }
    code = _decision.decide.__code__.co_filename
    reached: set[int] = set()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != code:
            return None
        if event == "line" and frame.f_lineno in returns:
            reached.add(frame.f_lineno)
        return trace

    sys.settrace(trace)
    try:
        for _, facts, _, _ in ROWS:
            decide(facts)
        test_the_recall_window()
    finally:
        sys.settrace(None)
    missed = sorted(returns - reached)
    assert not missed, f"lines {missed} of activities/_decision.py have no row"


def test_the_table_is_pure() -> None:
    """It imports nothing but the standard library's plain data: no client, no clock."""
    tree = ast.parse(inspect.getsource(_decision))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "dataclasses", "datetime", "enum"}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    clocks = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
    assert not {c for c in calls if c.rpartition(".")[2] in clocks}
