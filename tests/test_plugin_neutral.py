"""``exactcall.Plugin()`` on a client changes nothing for workflows and workers that never use
exactcall: the same plain workflows run with and without it, and give the same results,
histories and handler metadata."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

import exactcall
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from tests.plain_app import (
    MONEY,
    Dynamic,
    Echo,
    Greeter,
    Money,
    Slotted,
    SlottedPayer,
    Till,
    double,
    shout,
    sort_out,
)

WFT_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
ACT_STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED


@pytest.fixture
async def plain(server: DevServer) -> Client:
    """A client without exactcall."""
    return await Client.connect(server.address, namespace="default")


@pytest.fixture
async def added(server: DevServer) -> Client:
    """A client with exactcall.Plugin() in an app that defines no exactcall tool (this test
    process defines some, in its registry: ``tools=[]`` stands for none)."""
    conn = Connection(address=server.address, namespace="default")
    return await connect(conn, plugin=exactcall.Plugin(tools=[]))


@asynccontextmanager
async def split(client: Client, tq: str) -> AsyncIterator[None]:
    """A workflow-only worker and an activity-only worker on one task queue, in one process."""
    wf = Worker(client, task_queue=tq, workflows=[Greeter, Slotted, Dynamic, Echo], identity="wf")
    act = Worker(client, task_queue=tq, activities=[shout, sort_out], identity="act")
    async with wf, act:
        yield


async def shape(client: Client, wid: str) -> list[tuple[str, str]]:
    """Event types, with the identity of each task's worker."""
    out = []
    async for e in client.get_workflow_handle(wid).fetch_history_events():
        who = ""
        if e.event_type == WFT_STARTED:
            who = e.workflow_task_started_event_attributes.identity
        elif e.event_type == ACT_STARTED:
            who = e.activity_task_started_event_attributes.identity
        out.append((EventType.Name(e.event_type), who))
    return out


async def payload_bytes(client: Client, wid: str) -> list[bytes]:
    """The bytes of every payload the workflow's history carries (inputs and results)."""
    out = []
    async for e in client.get_workflow_handle(wid).fetch_history_events():
        for attrs, field in (
            ("workflow_execution_started_event_attributes", "input"),
            ("activity_task_scheduled_event_attributes", "input"),
            ("activity_task_completed_event_attributes", "result"),
            ("workflow_execution_completed_event_attributes", "result"),
        ):
            if e.HasField(attrs):
                out += [p.data for p in getattr(getattr(e, attrs), field).payloads]
    return out


async def run_all(client: Client) -> dict[str, Any]:
    tq = f"plain-{uuid.uuid4().hex[:8]}"
    seen: dict[str, Any] = {}
    async with split(client, tq):
        for n in range(6):  # several tasks: an extra workflow poller would take some of them
            wid = f"greet-{uuid.uuid4().hex[:8]}"
            out = await client.execute_workflow(Greeter.run, f"n{n}", id=wid, task_queue=tq)
            seen[f"greet{n}"] = (out, await shape(client, wid))
        wid = f"echo-{uuid.uuid4().hex[:8]}"
        out = await client.execute_workflow(Echo.run, {"b": 1, "a": 2}, id=wid, task_queue=tq)
        seen["echo"] = (out, await payload_bytes(client, wid))
        wid = f"slots-{uuid.uuid4().hex[:8]}"
        out = await client.execute_workflow(Slotted.run, "slots", id=wid, task_queue=tq)
        seen["slots"] = (out, await shape(client, wid))
        h = await client.start_workflow(
            Dynamic.run, id=f"dyn-{uuid.uuid4().hex[:8]}", task_queue=tq
        )
        await h.signal("exactcall.decide", "not exactcall's")  # a name like exactcall's
        answer = await h.query("exactcall.approvals")
        meta = await h.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        await h.signal("stop")
        seen["dynamic"] = (await h.result(), answer)  # (its tasks' batching is timing's)
        seen["metadata"] = (
            sorted(d.name for d in meta.definition.signal_definitions),
            sorted(d.name for d in meta.definition.query_definitions),
        )
    return seen


async def test_plain_workflows_are_the_same_with_and_without_the_plugin(
    added: Client, plain: Client
) -> None:
    without, with_plugin = await run_all(plain), await run_all(added)
    assert with_plugin == without
    for name, (_, events) in with_plugin.items():
        if name.startswith("greet") or name == "slots":
            # every workflow task on the workflow worker, every activity on the activity
            # worker, and no task failed (an extra poller would fail "not registered")
            assert {who for t, who in events if t == "EVENT_TYPE_WORKFLOW_TASK_STARTED"} == {"wf"}
            assert {who for t, who in events if t == "EVENT_TYPE_ACTIVITY_TASK_STARTED"} == {"act"}
            assert "EVENT_TYPE_WORKFLOW_TASK_FAILED" not in {t for t, _ in events}
    assert with_plugin["dynamic"][0] == ["exactcall.decide", "stop"]
    # its own handlers took exactcall's names: the signal was its, the query answered by it
    assert with_plugin["dynamic"][1] == ["exactcall.approvals", "exactcall.decide"]


async def test_split_workers_with_exactcall(client: Client, tq: str, bank: Bank, who: str) -> None:
    # the workflow side says its activities run elsewhere (Temporal's no_remote_activities):
    # exactcall's workflows go there, the tools to the activity-only worker, which never
    # polls workflow tasks (in one process the SDK refuses two workers that both do)
    wf = Worker(
        client, task_queue=tq, workflows=[SlottedPayer], no_remote_activities=True, identity="wf"
    )
    act = Worker(client, task_queue=tq, activities=[shout], identity="act")
    async with wf, act:
        wid = f"split-{who}"
        out = await client.execute_workflow(
            SlottedPayer.run, args=[bank.url, who], id=wid, task_queue=tq
        )
        events = await shape(client, wid)
    assert out["to"] == who and bank.count(to=who) == 1
    assert {w for t, w in events if t == "EVENT_TYPE_WORKFLOW_TASK_STARTED"} == {"wf"}
    assert {w for t, w in events if t == "EVENT_TYPE_ACTIVITY_TASK_STARTED"} == {"act"}


async def test_a_slots_workflow_calls_exactcall(
    client: Client, tq: str, bank: Bank, who: str
) -> None:
    async with Worker(client, task_queue=tq, workflows=[SlottedPayer]):
        out = await client.execute_workflow(
            SlottedPayer.run, args=[bank.url, who], id=f"slotpay-{who}", task_queue=tq
        )
    assert out["to"] == who
    assert bank.count(to=who) == 1


async def test_a_custom_payload_converter_works_and_is_left_alone(
    server: DevServer, bank: Bank, who: str
) -> None:
    # Temporal's samples/custom_converter: a composite with an encoding of the user's own
    plain = await Client.connect(server.address, namespace="default", data_converter=MONEY)
    conn = Connection(address=server.address, namespace="default")
    added = await connect(conn, plugin=exactcall.Plugin(), data_converter=MONEY)
    seen = []
    for client in (plain, added):
        tq = f"money-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=tq, workflows=[Till], activities=[double]):
            wid = f"till-{uuid.uuid4().hex[:8]}"
            out = await client.execute_workflow(Till.run, Money(21), id=wid, task_queue=tq)
            seen.append((out, await payload_bytes(client, wid)))
    assert seen[0] == seen[1] == (Money(42), [b"21", b"21", b"42", b"42"])
    # and exactcall's own payloads (the intent, its records) ride on it: a guarded call runs
    tq = f"money-{uuid.uuid4().hex[:8]}"
    async with Worker(added, task_queue=tq, workflows=[SlottedPayer]):
        out = await added.execute_workflow(
            SlottedPayer.run, args=[bank.url, who], id=f"money-pay-{who}", task_queue=tq
        )
    assert out["to"] == who and bank.count(to=who) == 1
