"""The fault-schedule explorer (``bench/explore.py``): a short run of a schedule with most of
its operations on two real worker processes, and its checks shown to catch what they are for.

Effects are counted at the demo bank; nothing is asserted on time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

from bench._explore_world import Run, World
from bench.explore import run_schedule
from exactcall.demo.bank import Bank
from exactcall.demo.bank_client import post_payment
from exactcall.embedded._server import DevServer

pytestmark = pytest.mark.crash

SCHEDULE = [
    {"op": "crash", "worker": 0, "tool": "ex_probed", "point": "in_call", "wait": 0.1},
    {"op": "start", "wf": 0, "wait": 0.3},
    {"op": "start", "wf": 1, "wait": 1.0},
    {"op": "freeze", "worker": 0, "seconds": 3.0, "wait": 0.5},
    {"op": "partition", "worker": 1, "seconds": 3.0, "wait": 1.0},
    {"op": "rollover", "wf": 0, "wait": 0.5},
    {"op": "approve-wrong", "wf": 0, "wait": 0.2},
    {"op": "double-approve", "wf": 0, "wait": 0.5},
    {"op": "deny", "wf": 1, "wait": 0.5},
    {"op": "kill", "worker": 1, "wait": 1.0},
    {"op": "resolve", "wf": 1, "wait": 0.5},
    {"op": "reset", "wf": 0, "at": 0.5, "wait": 1.0},
    {"op": "undo", "wf": 0, "wait": 0.2},
    {"op": "terminate", "wf": 1, "wait": 0.2},
    {"op": "start", "wf": 1, "wait": 0.5},
]


@pytest.fixture
async def world(client: Client, server: DevServer, bank: Bank) -> AsyncIterator[World]:
    w = World(client, server.address, bank)
    try:
        await w.start(2)
        yield w
    finally:
        w.stop()


async def test_a_schedule_of_every_kind_of_operation_pays_once_and_loses_nothing(
    world: World,
) -> None:
    out = await run_schedule(world, 0, SCHEDULE, wait=40.0)
    assert out["found"] == [], out["log"]
    acted = {line.split(" ", 1)[0] for line in out["log"] if "did nothing" not in line}
    # the operations that cannot miss their moment (the others depend on timing)
    assert {"crash", "start", "freeze", "partition", "kill", "undo"} <= acted, out["log"]


async def test_the_checks_catch_a_second_payment_and_an_unapproved_one(
    client: Client, server: DevServer, bank: Bank
) -> None:
    run = Run(World(client, server.address, bank), "checked", 1)
    wid = run.wid(0)
    assert run.safety() == []
    post_payment(bank.url, 1, wid)  # ex_plain's step, once: fine
    assert run.safety() == []
    post_payment(bank.url, 1, wid)  # twice
    post_payment(bank.url, 4, wid)  # the approval tool's amount, with no approval sent
    found = run.safety()
    assert any("2 payments to checked-w0 of 1" in f for f in found), found
    assert any("paid without an approval of its hash" in f for f in found), found
    run.approved[wid].append(run.exact_hash(0))
    assert len(run.safety()) == 1
