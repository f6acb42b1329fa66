"""A small fleet soak (``bench/soak.py``): three worker processes, one of them SIGKILLed at
random every 2-5 s and restarted, while 30 agent runs make 4 calls each (a plain tool, a
provider-idempotent one, one approved by a bot with its exact hash, one with a probe).

Effects are counted at the demo bank. Nothing is asserted on time: the settle figures are the
bench's to print (``python bench/soak.py``).
"""

from __future__ import annotations

import pytest
from temporalio.client import Client

from bench.soak import SoakConfig, run_soak
from exactcall._server import DevServer
from exactcall.demo.bank import Bank

pytestmark = pytest.mark.crash

RUNS = 30


async def test_killed_workers_never_pay_twice_and_every_call_ends_done_or_parked(
    client: Client, server: DevServer, bank: Bank
) -> None:
    # the tests' usual tuning (heartbeat 2 s, sticky 1 s) keeps it short. One run starts
    # every 0.5 s, so runs go on for 15 s at least: kills come at most 5 s apart, so at least
    # three land while runs are in flight, and tool bodies of up to 2 x 0.5 s make it likely
    # that they land inside calls
    cfg = SoakConfig(
        runs=RUNS,
        concurrency=10,
        start_every=0.5,
        pause_ms=500,
        heartbeat=2.0,
        sticky_timeout=1.0,
        timeout=150.0,
    )
    report = await run_soak(client, server.address, bank, cfg)
    why = report["problems"]
    assert report["runs"] == RUNS
    assert report["calls"] == 4 * RUNS
    assert report["kills"] >= 3
    assert report["calls_interrupted"] >= 1, report["kill_log"]
    assert report["duplicates"] == 0, why
    assert report["lost"] == 0, why
    assert report["wrong_receipts"] == 0, why
    assert report["approvals_refused"] == []
    assert report["approvals"] >= RUNS
