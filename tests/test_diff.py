"""``exactcall diff`` and ``exactcall.testing.assert_same_calls`` (issue 20 §3): the tool calls
of two runs, matched by step; only side effects make them differ."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import Worker

from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._replay import load_history, recorded_calls
from exactcall.testing import assert_same_calls
from tests.conftest import ROOT, plan, start_agent, step

HISTORIES = ROOT / "tests" / "histories"


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exactcall", "diff", *args, "--tools", "tests.tools",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def edited(tmp_path: Path, changes: dict[str, dict[str, Any]], name: str, raw: Any = None) -> Path:
    """plain_call.json (or the history ``raw``) with the arguments of some steps changed
    (activity id -> new args)."""
    raw = raw or json.loads((HISTORIES / "plain_call.json").read_text())
    for ev in raw["events"]:
        attrs = ev.get("activityTaskScheduledEventAttributes")
        if not attrs or attrs["activityId"] not in changes:
            continue
        payload = attrs["input"]["payloads"][0]
        intent = json.loads(base64.b64decode(payload["data"]))
        intent["args"].update(changes[attrs["activityId"]])
        payload["data"] = base64.b64encode(json.dumps(intent).encode()).decode()
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(raw))
    return out


async def test_a_history_is_the_same_as_itself() -> None:
    rc, out, _ = await cli(str(HISTORIES / "plain_call.json"), str(HISTORIES / "plain_call.json"))
    assert rc == 0, out
    assert out.splitlines()[0] == "3 steps: every side-effecting call is the same"
    assert "same     balance#1                balance (read-only)" in out


async def test_a_changed_payment_differs_and_a_changed_read_does_not(tmp_path: Path) -> None:
    a = str(HISTORIES / "plain_call.json")
    read_only = edited(tmp_path, {"balance#1": {"to": "bob"}}, "read_only")
    rc, out, _ = await cli(a, str(read_only))
    assert rc == 0, out  # shown, never counted
    assert 'changed  balance#1                balance (read-only): to: "alice" -> "bob"' in out
    paid_more = edited(tmp_path, {"pay#1": {"amount": 11}}, "paid_more")
    rc, out, _ = await cli(a, str(paid_more), "--json")
    assert rc == 1
    report = json.loads(out)
    assert report["same"] is False
    [changed] = [s for s in report["steps"] if s["status"] == "changed"]
    assert changed["step"] == "pay#1" and changed["changes"] == [
        {"field": "amount", "a": 10, "b": 11}
    ]
    with pytest.raises(AssertionError, match=r"pay#1 .*amount: 10 -> 11"):
        await assert_same_calls(a, paid_more)
    await assert_same_calls(a, read_only)


async def test_steps_only_in_one_run_and_bad_input(tmp_path: Path) -> None:
    rc, out, _ = await cli(str(HISTORIES / "plain_call.json"), str(HISTORIES / "approval.json"))
    assert rc == 1
    assert "only A   pay#1" in out and "only B   transfer#1" in out
    assert out.splitlines()[0] == "4 steps: 3 side-effecting calls differ"
    rc, _, err = await cli(str(tmp_path / "missing.json"), str(HISTORIES / "approval.json"))
    assert rc == 2 and "no such history file" in err
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a history"}')
    rc, _, err = await cli(str(junk), str(HISTORIES / "approval.json"))
    assert rc == 2 and "is not a workflow history" in err


async def test_two_live_runs_by_workflow_id(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    # the same task twice, the second run paying someone else: which payment would change
    one = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)))
    two = await start_agent(client, tq, plan(step("pay", bank.url, 10, f"{who}-2")))
    await one.result()
    await two.result()
    rc, out, _ = await cli(one.id, f"{two.id}:{two.result_run_id}", "--address", server.address)
    assert rc == 1, out
    assert f'changed  pay#1                    pay: to: "{who}" -> "{who}-2"' in out
    await assert_same_calls(one.id, one.id, client=client)


async def test_a_history_says_which_calls_were_reads_so_diff_needs_no_tools(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str, tmp_path: Path
) -> None:
    # issue 34 §3: a read's scheduled activity carries the exactcall-read header
    h = await start_agent(
        client, tq, plan(step("pay", bank.url, 10, who), step("balance", bank.url, who))
    )
    await h.result()
    history = await client.get_workflow_handle(h.id).fetch_history()
    calls = await recorded_calls(history, DataConverter.default)
    assert [(c.intent.step, c.read) for c in calls] == [("pay#1", False), ("balance#1", True)]
    a = tmp_path / "a.json"
    a.write_text(json.dumps(history.to_json_dict()))
    b = edited(tmp_path, {"balance#1": {"to": "bob"}}, "b", raw=history.to_json_dict())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exactcall", "diff", str(a), str(b),  # no --tools
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode() + err.decode()
    assert "changed  balance#1                balance (read-only)" in out.decode()
    # a history from before the header: without --tools, a read cannot be told (a side effect)
    assert all(
        c.read is None
        for c in await recorded_calls(
            load_history(HISTORIES / "plain_call.json"), DataConverter.default
        )
    )
