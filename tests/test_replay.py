"""Stored histories of every workflow shape replay against the current code."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

import exactcall
from exactcall.evidence._replay import replay_histories
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
        # the same run, its tool activities' inputs in the compact form (WireIntent); the
        # file above has them as full intents, as exactcall wrote them before
        "plain_call_wire",
        "continue_as_new_first",
        "continue_as_new_last",
        "call_record",
        "approval",
        # recorded while the choice "on" was pinned by a marker too (exactcall.search-attributes.on)
        "approval_pinned_on",
        "reconciliation_agent",
        "reconciliation",
        # verdicts written by the exactcall.mark_record local activity (records that close by
        # themselves); the three files above are of exactcall 0.x and stay as they are
        "reconciliation_marked_agent",
        "reconciliation_marked",
        # the reconciliation's patches decided in its first workflow task
        # (exactcall.reconcile-decides-at-start); the two above ask them where each is used
        "reconciliation_at_start_agent",
        "reconciliation_at_start",
        # a probe's "not landed" re-runs the call at once (the old shape), or once the earlier
        # attempt's claim has run out and the probe said it again
        # (exactcall.reconcile-outwaits-the-claim)
        "reconciliation_rerun",
        "reconciliation_rerun_agent",
        "reconciliation_outwaits",
        "reconciliation_outwaits_agent",
    } <= names


async def test_an_incompatible_change_fails_replay() -> None:
    replayer = Replayer(
        workflows=[AgentWithExtraLookup], plugins=[exactcall.Plugin(tools=[])], namespace="default"
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(load(HISTORIES / "plain_call.json"))


@pytest.mark.parametrize("name", ["plain_call", "plain_call_wire"])
async def test_exactcall_replay_catches_intent_drift_that_temporal_replay_misses(
    name: str,
) -> None:
    from tests.workflows_changed import AgentPaysOneMore

    history = load(HISTORIES / f"{name}.json")
    plain = Replayer(
        workflows=[AgentPaysOneMore], plugins=[exactcall.Plugin(tools=[])], namespace="default"
    )
    await plain.replay_workflow(history)  # Temporal's own replay does not see the change
    [report] = await replay_histories([HISTORIES / f"{name}.json"], [AgentPaysOneMore])
    assert not report.ok
    assert any("amount: 10 -> 11" in p and "pay#1" in p for p in report.problems), report.problems
    [good] = await replay_histories([HISTORIES / f"{name}.json"], [Agent])
    assert good.ok and good.calls == 3 and good.namespace == "default"


async def test_both_forms_of_a_tool_input_read_as_the_same_intents() -> None:
    """The compact input leaves out the key, the workflow type and the task queue; a reader
    gets them back (the key derived, the rest from the history), equal to the full form's."""
    from exactcall._canonical import derive_key
    from exactcall.evidence._replay import _converter, recorded_intents

    conv = _converter([exactcall.Plugin(tools=[])])
    full = await recorded_intents(load(HISTORIES / "plain_call.json"), conv)
    wire = await recorded_intents(load(HISTORIES / "plain_call_wire.json"), conv)
    assert len(full) == len(wire) == 3  # (the plan's last call is refused before it runs)
    for a, b in zip(full, wire, strict=True):
        # (two runs of one plan: only the bank's URL in the arguments, and so the hash, differ)
        assert a.model_dump(exclude={"args", "args_hash"}) == b.model_dump(
            exclude={"args", "args_hash"}
        )
        assert b.key == derive_key(b.namespace, b.workflow_id, b.step, b.tool, b.tool_version)
    raw = json.loads((HISTORIES / "plain_call_wire.json").read_text())
    inputs = [
        ev["activityTaskScheduledEventAttributes"]["input"]["payloads"][0]["data"]
        for ev in raw["events"]
        if "activityTaskScheduledEventAttributes" in ev
    ]
    first = json.loads(base64.b64decode(inputs[0]))
    assert {"key", "workflow_type", "record_task_queue", "explicit_key"}.isdisjoint(first)
    assert {"tool", "args", "args_hash", "workflow_id", "step", "namespace"} <= first.keys()


async def test_replay_cli_reports_per_file_and_exits_1(tmp_path: Path) -> None:
    import asyncio
    import sys

    from tests.conftest import ROOT

    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "exactcall",
            "replay",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
        )
        out, _ = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode()

    rc, out = await run(str(HISTORIES), "--workflows", "tests.workflows", "--tools", "tests.tools")
    assert rc == 0, out
    assert out.count("ok ") == len(list(HISTORIES.glob("*.json")))
    rc, out = await run(
        str(HISTORIES / "plain_call.json"),
        "--workflows",
        "tests.workflows_changed:AgentPaysOneMore",
        "--tools",
        "tests.tools",
    )
    assert rc == 1 and "FAIL" in out and "intent drift" in out
    # a history replayed under another namespace derives other keys: reported, not hidden
    rc, out = await run(
        str(HISTORIES / "reconciliation_agent.json"),
        "--workflows",
        "tests.workflows",
        "--tools",
        "tests.tools",
        "--namespace",
        "elsewhere",
    )
    assert rc == 1, out


async def test_history_export_then_replay(
    server: object, client: object, worker: object, tq: str, bank: object, who: str, tmp_path: Path
) -> None:
    import asyncio
    import sys

    from tests.conftest import ROOT, plan, start_agent, step

    h = await start_agent(client, tq, plan(step("pay", bank.url, 3, who)))  # type: ignore[arg-type,attr-defined]
    await h.result()
    out = tmp_path / "exported.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "history",
        "export",
        h.id,
        "-o",
        str(out),
        "--address",
        server.address,
        cwd=ROOT,  # type: ignore[attr-defined]
    )
    assert await proc.wait() == 0
    [report] = await replay_histories([out], [Agent])
    assert report.ok and report.calls == 1 and report.workflow_id == h.id


def _with_input(src: Path, dst: Path, activity: str, edit: Any) -> Path:
    """A copy of a stored history whose (last) ``activity`` input JSON is changed by ``edit``."""
    import base64

    raw = json.loads(src.read_text())
    [*_, attrs] = [
        a
        for ev in raw["events"]
        if (a := ev.get("activityTaskScheduledEventAttributes"))
        and a["activityType"]["name"] == activity
    ]
    payload = attrs["input"]["payloads"][0]
    payload["data"] = base64.b64encode(edit(base64.b64decode(payload["data"]))).decode()
    dst.write_text(json.dumps(raw))
    return dst


async def test_an_undecodable_intent_is_reported_not_taken_for_a_plain_activity(
    tmp_path: Path,
) -> None:
    import tests.tools  # noqa: F401  (registers "balance", as `exactcall replay --tools` does)

    def extra_field(data: bytes) -> bytes:  # e.g. an Intent model changed since the history
        return json.dumps({**json.loads(data), "added_later": 1}).encode()

    # the last call: before, it was skipped silently, and its intent never compared
    bad = _with_input(HISTORIES / "plain_call.json", tmp_path / "bad.json", "balance", extra_field)
    [report] = await replay_histories([bad], [Agent])
    assert not report.ok
    [problem] = report.problems
    assert "'balance'" in problem and "does not decode as an Intent" in problem, problem
    assert "registered exactcall tool" in problem and "added_later" in problem, problem
    assert report.calls == 2

    # an intent-shaped input under an activity type no tool has: still not taken as plain
    renamed = json.loads(bad.read_text())
    for ev in renamed["events"]:
        a = ev.get("activityTaskScheduledEventAttributes")
        if a and a["activityType"]["name"] == "balance":
            a["activityType"]["name"] = "not_a_tool"
    (tmp_path / "renamed.json").write_text(json.dumps(renamed))
    [report] = await replay_histories([tmp_path / "renamed.json"], [Agent])
    assert not report.ok and "an intent's fields" in report.problems[0], report.problems


async def test_a_plain_activity_input_is_not_reported(tmp_path: Path) -> None:
    def plain(data: bytes) -> bytes:  # what a plain Temporal activity's input looks like
        return json.dumps({"account": "alice", "amount": 3}).encode()

    path = _with_input(HISTORIES / "plain_call.json", tmp_path / "plain.json", "balance", plain)
    raw = json.loads(path.read_text())
    for ev in raw["events"]:
        a = ev.get("activityTaskScheduledEventAttributes")
        if a and a["activityType"]["name"] == "balance":
            a["activityType"]["name"] = "plain_lookup"
    path.write_text(json.dumps(raw))
    [report] = await replay_histories([path], [Agent])
    assert report.calls == 2
    assert not any("does not decode" in p for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("hinted_read_done", True),
        ("hinted_read_cancelled", True),
        # recorded since (the patch): a write's path, on every worker, whatever its hint
        ("hinted_read_cancelled_patched", True),
        ("hinted_read_cancelled_patched", False),
    ],
)
async def test_a_read_only_none_mcp_call_replays_as_recorded(
    name: str, hint: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hinted_read_*: recorded before Core v3 by a worker whose trusted server hinted show_key
    # read-only, so its workflow took the read path (a plain activity, cancelled without
    # waiting); they replay on a worker that saw the same hint, as the recording one did
    from tests import mcp_app

    for t in (mcp_app.trusted_show_key, mcp_app.unpolled_show_key):
        monkeypatch.setattr(t, "hinted_read_only", hint)
    replayer = Replayer(
        workflows=[mcp_app.HintedRead], plugins=[exactcall.Plugin(tools=[])], namespace="default"
    )
    await replayer.replay_workflow(load(HISTORIES / "mcp" / f"{name}.json"))
