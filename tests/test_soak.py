"""A small fleet soak (``bench/soak.py``): three worker processes, one of them SIGKILLed at
random every 2-5 s and restarted, while 30 agent runs make 4 calls each (a plain tool, a
provider-idempotent one, one approved by a bot with its exact hash, one with a probe); and a
small one with every fault (``--faults all``): killed, frozen and cut-off workers, the server
killed and restarted on its database, and the bank's answers lost after the payment.

Effects are counted at the demo bank. Nothing is asserted on time: the settle figures are the
bench's to print (``python bench/soak.py``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from temporalio.client import Client

from bench._soak_faults import KINDS
from bench.soak import SoakConfig, run_soak
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.testing import free_port

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


async def test_every_fault_at_random_never_pays_twice_nor_loses_a_call(
    bank: Bank, tmp_path: Path
) -> None:
    # its own dev server on a database file: the server fault SIGKILLs and restarts it. The
    # first four faults are one of each kind (worker, freeze, partition, server) in a seeded
    # order, 2-3 s apart, while runs are in flight, then two more at random; the first run's
    # first two payments lose their answers at the chaos proxy (a closed connection, a 502),
    # and 10% of the others
    seed = random.randrange(2**31)
    cfg = SoakConfig(
        runs=16,
        concurrency=8,
        start_every=0.5,
        pause_ms=500,
        heartbeat=2.0,
        sticky_timeout=1.0,
        task_timeout=2.0,
        kill_every=(2.0, 3.0),
        max_faults=6,
        timeout=120.0,
        seed=seed,
        faults=KINDS,
    )
    with DevServer(db=tmp_path / "temporal.db", port=free_port()) as server:
        client = await connect(Connection(address=server.address, namespace="default"))
        report = await run_soak(client, server.address, bank, cfg, server=server)
    why = {"seed": seed, "problems": report["problems"], "faults": report["by_fault"]}
    assert report["calls"] == 4 * cfg.runs
    assert report["duplicates"] == 0, why
    assert report["lost"] == 0, why
    assert report["wrong_receipts"] == 0, why
    for kind in KINDS:
        assert report["by_fault"][kind]["injected"] >= 1, (kind, why)
    assert sum(c["calls_hit"] for k, c in report["by_fault"].items() if k != "none") >= 1, why
    assert all(u["reason"] for u in report["unknown_calls"]), report["unknown_calls"]
    assert report["unknown"] == len(report["unknown_calls"])
    assert report["approvals_refused"] == []
