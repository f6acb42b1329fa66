"""Whether a run upserts exactcall's search attributes is pinned in its own history.

``exactcall.Plugin(search_attributes=...)`` is a worker-level flag; a rolling change of it would
make a replaying worker drop (or add) upsert commands and fail the run with a nondeterminism
error. The first upsert pins the choice (exactcall.workflows._state): "off" as a patch marker,
"on" as the absence of one (a marker costs a visibility write per run), and replays follow the
history whatever the replaying worker's flag.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

import exactcall
from exactcall import approvals
from exactcall._worker import Connection, connect
from exactcall.approvals._binding import PENDING_ATTRIBUTE
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.workflows._state import SEARCH_ATTRIBUTES_OFF_PATCH, SEARCH_ATTRIBUTES_ON_PATCH
from tests.conftest import plan, running_worker, start_agent, step
from tests.test_approvals import pending_of
from tests.test_replay import HISTORIES
from tests.workflows import Agent, BareAgent, Rounds, Uncaught


async def _client(server: DevServer, search_attributes: bool) -> Client:
    conn = Connection(address=server.address, namespace="default")
    return await connect(conn, exactcall.Plugin(search_attributes=search_attributes))


def _patches(history: WorkflowHistory) -> list[str]:
    """Ids of the patch markers in a history (Temporal core's ``core_patch`` markers)."""
    out = []
    for ev in history.events:
        attrs = ev.marker_recorded_event_attributes
        if ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and attrs.marker_name == (
            "core_patch"
        ):
            [payload] = attrs.details["patch-data"].payloads
            out.append(json.loads(payload.data)["id"])
    return out


def _count(history: WorkflowHistory, event_type: int) -> int:
    return sum(1 for ev in history.events if ev.event_type == event_type)


def _pending_upserts(history: WorkflowHistory) -> list[bool]:
    """Values of the ExactcallPending upserts (Temporal also upserts TemporalChangeVersion
    when it records a patch marker)."""
    out = []
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = ev.upsert_workflow_search_attributes_event_attributes.search_attributes
            if PENDING_ATTRIBUTE in fields.indexed_fields:
                out.append(json.loads(fields.indexed_fields[PENDING_ATTRIBUTE].data))
    return out


async def _replay(history: WorkflowHistory, search_attributes: bool) -> None:
    replayer = Replayer(
        workflows=[Agent, Uncaught, Rounds, BareAgent],
        plugins=[exactcall.Plugin(tools=[], search_attributes=search_attributes)],
        namespace="default",
    )
    await replayer.replay_workflow(history)  # raises on nondeterminism


async def _approved_run(client: Client, tq: str, bank: Bank, who: str) -> WorkflowHistory:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    await approvals.approve(client, handle.id, req.step, args_hash=req.args_hash, by="ops")
    out: Any = await handle.result()
    assert "ok" in out[0], out
    return await handle.fetch_history()


@pytest.mark.parametrize("flag", [True, False], ids=["recorded-on", "recorded-off"])
async def test_a_run_replays_on_a_worker_with_the_other_flag(
    server: DevServer, tq: str, bank: Bank, who: str, flag: bool
) -> None:
    client = await _client(server, flag)
    async with running_worker(client, tq):
        history = await _approved_run(client, tq, bank, who)
    upserts = _pending_upserts(history)
    assert bool(upserts) == flag, upserts
    # "on", the default, is pinned by the absence of a marker: no marker, no TemporalChangeVersion
    assert _patches(history) == ([] if flag else [SEARCH_ATTRIBUTES_OFF_PATCH]), _patches(history)
    if flag:  # every upsert is exactcall's (none of TemporalChangeVersion)
        upsert_events = _count(history, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
        assert upsert_events == len(upserts)
    await _replay(history, search_attributes=flag)
    await _replay(history, search_attributes=not flag)


async def _run_across(
    server: DevServer, tq: str, bank: Bank, who: str, first: bool, then: bool
) -> WorkflowHistory:
    """A run that reaches pending on a worker with flag ``first`` and is approved, and ends,
    on one with flag ``then``; its history, checked for a clean end and one payment."""
    before, after = await _client(server, first), await _client(server, then)
    async with running_worker(before, tq):
        handle = await start_agent(before, tq, plan(step("transfer", bank.url, 10, who)))
        req = await pending_of(before, handle)  # the run's choice is made by now
    # the rest of the run on the other worker: it replays the start, then goes on
    async with running_worker(after, tq):
        await approvals.approve(after, handle.id, req.step, args_hash=req.args_hash, by="ops")
        # unpinned, the replay drops (or adds) an upsert: a nondeterminism error, and it hangs
        out: Any = await asyncio.wait_for(handle.result(), 30)
    assert "ok" in out[0], out
    assert bank.count(who) == 1
    history = await handle.fetch_history()
    assert _count(history, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED) == 0
    return history


async def test_a_rolling_flag_change_mid_run_keeps_the_runs_choice(
    server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    history = await _run_across(server, tq, bank, who, first=True, then=False)
    # the choice made at the first upsert held: pending went back to false on the new worker
    upserts = _pending_upserts(history)
    assert upserts[0] is True and upserts[-1] is False, upserts
    assert _patches(history) == []


async def test_a_run_started_off_stays_off_on_a_worker_with_the_flag_on(
    server: DevServer, tq: str, bank: Bank, who: str
) -> None:
    history = await _run_across(server, tq, bank, who, first=False, then=True)
    assert _pending_upserts(history) == []  # the worker with the flag on upserted nothing
    assert _patches(history) == [SEARCH_ATTRIBUTES_OFF_PATCH]


@pytest.mark.parametrize("flag", [True, False], ids=["flag-on", "flag-off"])
async def test_a_history_that_recorded_on_as_a_marker_still_replays(flag: bool) -> None:
    # exactcall 0.1.0 workers recorded "on" as a marker too (approval_pinned_on.json)
    raw = json.loads((HISTORIES / "approval_pinned_on.json").read_text())
    history = WorkflowHistory.from_json("hist-approval", raw)
    assert _patches(history) == [SEARCH_ATTRIBUTES_ON_PATCH]
    assert _pending_upserts(history)[0] is True
    await _replay(history, search_attributes=flag)
