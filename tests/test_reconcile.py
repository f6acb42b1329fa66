"""Unknown outcomes go to reconciliation: probes, parking, a person's verdict, real kills."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import Client

from exactcall import reconciliation
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.evidence._audit import AuditFilter, audit_rows
from exactcall.testing import WorkerProcess
from tests.conftest import plan, start_agent, step
from tests.test_approvals import eventually
from tests.test_approvals_cli import cli

pytestmark = pytest.mark.crash


async def crashed_call(
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    crash_at: str,
    the_step: dict[str, Any],
    then_crash_at: str | None = None,
) -> Any:
    """Start the call on worker A, which is SIGKILLed at ``crash_at``; worker B takes over."""
    a = await worker_process(tq, crash_at=crash_at).started()
    handle = await start_agent(client, tq, plan(the_step))
    assert await a.killed() == -9
    b = await worker_process(tq, crash_at=then_crash_at).started()
    if then_crash_at:
        assert await b.killed() == -9
        await worker_process(tq).started()
    return handle


async def parked(client: Client, workflow_id: str) -> reconciliation.UnresolvedCall:
    rows = await eventually(
        lambda: reconciliation.list_unresolved(client),
        lambda rows: any(r.workflow_id == workflow_id for r in rows),
        timeout=30,
    )
    return next(r for r in rows if r.workflow_id == workflow_id)


def keyed(bank: Bank, who: str) -> list[dict[str, Any]]:
    return [p for p in bank.payments() if p["to_account"] == who]


async def test_crash_after_the_effect_probe_finds_it_landed(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    h = await crashed_call(
        client, worker_process, tq, "book:after_call:1", step("book", bank.url, 10, who)
    )
    out = await h.result()
    assert out[0]["ok"]["found_by"] == "probe"
    [row] = keyed(bank, who)
    assert out[0]["ok"]["payment_id"] == row["id"] and row["request_count"] == 1
    st = await reconciliation.state(client, reconciliation.reconcile_id(row["idempotency_key"]))
    assert st.settled is not None and st.settled.decided_by == "probe"
    assert st.settled.verdict == "landed"


async def test_crash_before_the_request_left_probe_says_not_landed_and_it_runs_once(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    h = await crashed_call(
        client, worker_process, tq, "book:in_call:1", step("book", bank.url, 10, who)
    )
    out = await h.result()
    [row] = keyed(bank, who)
    assert out[0]["ok"]["payment_id"] == row["id"] and "found_by" not in out[0]["ok"]


@pytest.mark.parametrize("verdict", ["landed", "not_landed", "abandon"])
async def test_no_probe_parks_until_a_person_resolves(
    verdict: str,
    server: DevServer,
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    # in_call: the pre-call marker is written but the request never left, so "not landed" is
    # the truth here; with "landed" the person supplies the result
    h = await crashed_call(
        client,
        worker_process,
        tq,
        "book_no_probe:in_call:1",
        step("book_no_probe", bank.url, 10, who),
    )
    row = await parked(client, h.id)
    assert (row.tool, row.step, row.args["to"]) == ("book_no_probe", "book_no_probe#1", who)
    assert "no probe" in row.reason
    rc, out, _ = await cli(server, "unresolved", "--json")
    assert rc == 0 and any(r["workflow_id"] == h.id for r in json.loads(out))
    flag = {"landed": "--landed", "not_landed": "--not-landed", "abandon": "--abandon"}[verdict]
    extra = (
        ["--result", json.dumps({"payment_id": -1, "manual": True})] if verdict == "landed" else []
    )
    rc, out, err = await cli(
        server,
        "resolve",
        h.id,
        row.step,
        flag,
        *extra,
        "--yes",
        "--as",
        "ops",
        "--reason",
        "checked the ledger",
    )
    assert rc == 0, err
    result = (await h.result())[0]
    if verdict == "landed":
        assert result["ok"] == {"payment_id": -1, "manual": True}
        assert bank.count(to=who) == 0
    elif verdict == "not_landed":
        assert result["ok"]["to"] == who
        assert bank.count(to=who) == 1
    else:
        assert result["error"] == "CallAbandoned" and "ops" in result["message"]
        assert bank.count(to=who) == 0
    st = await reconciliation.state(client, row.reconcile_id)
    assert st.settled is not None and st.settled.decided_by == "ops"
    # the audit shows who settled it and the reason they gave (issue 33 §3)
    [audited] = [r async for r in audit_rows(client, AuditFilter(workflow=h.id))]
    assert (audited["verdict"], audited["settled_by"]) == (verdict, "ops")
    assert audited["reason"] == "checked the ledger"
    # settled: no longer listed; a second verdict is refused with exit 1
    await eventually(
        lambda: reconciliation.list_unresolved(client),
        lambda rows: all(r.workflow_id != h.id for r in rows),
    )
    rc, _, _ = await cli(server, "resolve", h.id, row.step, "--abandon", "--yes")
    assert rc == 1


async def test_provider_idempotent_past_its_window_is_never_re_called(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    h = await crashed_call(
        client,
        worker_process,
        tq,
        "stripe_like:after_call:1",
        step("stripe_like", bank.url, 10, who),
    )
    out = await h.result()
    [row] = keyed(bank, who)
    assert row["request_count"] == 1  # not re-sent: the provider may have pruned the key
    assert out[0]["ok"]["found_by"] == "probe"


async def test_on_unknown_raise_returns_at_once_and_stays_listed_until_settled(
    server: DevServer,
    client: Client,
    worker_process: Callable[..., WorkerProcess],
    tq: str,
    bank: Bank,
    who: str,
) -> None:
    h = await crashed_call(
        client,
        worker_process,
        tq,
        "book_blind:after_call:1",
        step("book_blind", bank.url, 10, who, on_unknown="raise"),
    )
    out = await h.result()
    assert out[0]["error"] == "AmbiguousOutcome"
    assert "exactcall unresolved" in out[0]["message"]
    row = await parked(client, h.id)
    assert row.reason == "the ledger is down"
    # no head-of-line blocking: another workflow on the same worker runs while it is parked
    other = await start_agent(client, tq, plan(step("pay", bank.url, 1, "other-" + who)))
    assert (await asyncio.wait_for(other.result(), 30))[0]["ok"]["amount"] == 1
    res = await reconciliation.resolve(
        client, h.id, row.step, "landed", result={"payment_id": keyed(bank, who)[0]["id"]}, by="ops"
    )
    assert res.accepted
    await eventually(
        lambda: reconciliation.list_unresolved(client),
        lambda rows: all(r.workflow_id != h.id for r in rows),
    )
    assert bank.count(to=who) == 1


async def test_crash_during_the_re_run_still_gives_one_effect(
    client: Client, worker_process: Callable[..., WorkerProcess], tq: str, bank: Bank, who: str
) -> None:
    # A dies before the request left; the probe says not landed; B re-runs it and dies right
    # after the payment; C's attempt finds the re-run ambiguous and the probe finds it landed
    h = await crashed_call(
        client,
        worker_process,
        tq,
        "book:in_call:1",
        step("book", bank.url, 10, who),
        then_crash_at="book:after_call:1",
    )
    out = await h.result()
    [row] = keyed(bank, who)
    assert out[0]["ok"]["payment_id"] == row["id"]
    assert row["request_count"] == 1


async def test_probe_past_its_deadline_parks_the_call(
    client: Client, worker: object, tq: str, bank: Bank, who: str
) -> None:
    h = await start_agent(
        client, tq, plan(step("book_slow_probe", bank.url, 10, who, on_unknown="raise"))
    )
    out = await h.result()
    assert out[0]["error"] == "AmbiguousOutcome"
    row = await parked(client, h.id)
    assert "deadline" in row.reason or "failed" in row.reason, row.reason
    res = await reconciliation.resolve(client, h.id, row.step, "abandon", by="ops")
    assert res.accepted
    assert bank.count(to=who) == 1


async def test_landed_needs_the_result_the_agent_gets(server: DevServer) -> None:
    rc, _, err = await cli(server, "resolve", "some-workflow", "pay#1", "--landed", "--yes")
    assert rc == 2
    assert "--landed needs --result JSON" in err and "--result null for none" in err
