"""Notifications: bounded retries at a real local receiver, both formats, and the watcher's
memory of what it sent (a restart announces nothing twice)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from exactcall import approvals
from exactcall.demo.bank import Bank
from exactcall.embedded._server import free_port
from exactcall.inbox import Event, Notifier, Webhook
from tests.conftest import plan, start_agent, step
from tests.inbox_app import Receiver
from tests.test_approvals import eventually, pending_of

EVENT = Event(
    "approval_requested",
    "wf-1",
    "transfer#1",
    "transfer",
    "ab" * 32,
    "http://inbox.example/call?wf=wf-1&step=transfer%231",
    "2026-01-01T00:00:00+00:00",
    {"requested_by": "agent-7"},
)


async def test_a_failing_receiver_is_tried_again_a_bounded_number_of_times() -> None:
    with Receiver(fail_first=2) as r:
        assert await Webhook(r.url, "json", attempts=3, backoff=0.05).send(EVENT)
        assert r.posts == 3
        assert r.bodies == [
            {
                "event": "approval_requested",
                "workflow_id": "wf-1",
                "step": "transfer#1",
                "tool": "transfer",
                "args_hash": "ab" * 32,
                "link": EVENT.link,
                "at": EVENT.at,
                "details": {"requested_by": "agent-7"},
            }
        ]
    with Receiver(fail_first=10) as r:
        assert not await Webhook(r.url, "json", attempts=3, backoff=0.05).send(EVENT)
        assert (r.posts, r.bodies) == (3, [])  # then dropped: never retried for ever


async def test_an_unreachable_receiver_gives_up_in_bounded_time() -> None:
    t = time.monotonic()
    hook = Webhook(f"http://127.0.0.1:{free_port()}/hook", attempts=2, timeout=1, backoff=0.05)
    assert not await hook.send(EVENT)
    assert time.monotonic() - t < 10


async def test_slack_format_is_one_text_with_the_call_and_the_link() -> None:
    with Receiver() as r:
        assert await Webhook(r.url, "slack").send(EVENT)
    (body,) = r.bodies
    assert list(body) == ["text"]
    text = body["text"]
    assert "approval requested: transfer transfer#1 in wf-1" in text
    assert "abababababababab" in text and f"<{EVENT.link}|open in the inbox>" in text
    assert "requested_by: agent-7" in text


def test_a_notify_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="give an http:// or https:// URL"):
        Webhook("slack.example/hook")


async def test_a_restarted_watcher_does_not_announce_a_call_twice(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str, tmp_path: Path
) -> None:
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    req = await pending_of(client, handle)
    with Receiver() as r:
        for _ in range(2):  # the inbox stopped and started again, on the same state file
            n = Notifier(client, Webhook(r.url), "http://inbox", tmp_path / "notified.json")
            await eventually(n.tick, lambda _: len(r.events(handle.id)) > 0)
            await n.drain()
        assert [e["event"] for e in r.events(handle.id)] == ["approval_requested"]
        await approvals.deny(client, handle.id, req.step, args_hash=req.args_hash, by="ops")
        await handle.result()
        n = Notifier(client, Webhook(r.url), "http://inbox", tmp_path / "notified.json")
        await eventually(n.tick, lambda _: len(r.events(handle.id)) == 3)
        await n.drain()
        events = r.events(handle.id)
    assert [e["event"] for e in events] == [
        "approval_requested",
        "approval_decided",
        "call_settled",
    ]
    assert (
        events[1]["details"]["decision"] == "denied" and events[1]["details"]["denied_by"] == "ops"
    )
    assert events[2]["details"]["outcome"] == "denied"
    assert events[2]["link"] == f"http://inbox/run?wf={handle.id}"
