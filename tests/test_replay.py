"""Stored histories of every workflow shape replay against the current code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

import exactcall
from tests.workflows import Agent, BareAgent, Rounds, Uncaught
from tests.workflows_changed import AgentWithExtraLookup

HISTORIES = Path(__file__).parent / "histories"


def load(path: Path) -> WorkflowHistory:
    raw = json.loads(path.read_text())
    wid = raw["events"][0]["workflowExecutionStartedEventAttributes"].get("workflowId", path.stem)
    return WorkflowHistory.from_json(wid, raw)


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_stored_history_replays(path: Path) -> None:
    # the namespace the histories ran in: keys (and the child ids derived from them) depend on
    # it, and Temporal's Replayer would otherwise substitute a placeholder
    replayer = Replayer(
        workflows=[Agent, Uncaught, Rounds, BareAgent],
        plugins=[exactcall.Plugin(tools=[])],
        namespace="default",
    )
    await replayer.replay_workflow(load(path))


async def test_there_is_a_history_for_each_shape() -> None:
    names = {p.stem for p in HISTORIES.glob("*.json")}
    assert {
        "plain_call",
        "continue_as_new_first",
        "continue_as_new_last",
        "call_record",
        "approval",
        "reconciliation_agent",
        "reconciliation",
    } <= names


async def test_an_incompatible_change_fails_replay() -> None:
    replayer = Replayer(
        workflows=[AgentWithExtraLookup], plugins=[exactcall.Plugin(tools=[])], namespace="default"
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(load(HISTORIES / "plain_call.json"))
