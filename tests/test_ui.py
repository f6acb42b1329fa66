"""What the Temporal UI shows the person on call, read through the API on a real dev server.

The UI reads a workflow's current details with the ``__temporal_workflow_metadata`` query and
its summary and details from ``describe()``; the saved views are visibility queries. Each is
checked here as the UI gets it; ``scripts/ui_screenshots.py`` looks at the rendered pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import uuid
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.worker import Worker

import exactcall
from exactcall import approvals, reconciliation
from exactcall._model import RecordInit
from exactcall._ui import RUN_CLAIM_WORKFLOW, SAVED_VIEWS
from exactcall._worker import build_worker
from exactcall.activities import _runs
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.workflows import RECORD_WORKFLOW, record_id
from tests.conftest import WORKFLOWS, plan, start_agent, step
from tests.test_approvals import eventually
from tests.test_approvals_cli import cli
from tests.tools import _keyed_post

OWN_DETAILS = "Refund of order 42 for a customer"


@exactcall.tool(heartbeat_timeout=timedelta(seconds=2))
def ui_lost_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays under the call's key, then loses the answer; no probe: the call is parked."""
    _keyed_post(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


@workflow.defn(sandboxed=False)  # defined in a test module: plain code, no sandbox re-import
class OwnDetailsAgent:
    """Sets current details of its own, then makes two calls that wait for approval."""

    @workflow.run
    async def run(self, bank: str, who: str) -> dict[str, Any]:
        workflow.set_current_details(OWN_DETAILS)
        calls = [asyncio.ensure_future(_outcome("transfer", bank, n, who)) for n in (10, 20)]
        results = list(await asyncio.gather(*calls))
        return {"results": results, "details": workflow.get_current_details()}


async def _outcome(tool: str, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": await exactcall.call(tool, *args)}
    except exactcall.ExactcallError as err:
        return {"error": err.code}


async def details(handle: WorkflowHandle[Any, Any]) -> str:
    """The workflow's current details, as the UI reads them."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


def joined(text: str) -> str:
    """The details with each shell continuation line joined, as a shell reads them."""
    return text.replace(" \\\n  ", " ")


def command_of(text: str, verb: str, step_name: str) -> list[str]:
    """The ``exactcall <verb> ...`` command the details give for ``step_name``, as argv."""
    [line] = [
        ln
        for ln in joined(text).splitlines()
        if ln.startswith(f"exactcall {verb} ") and step_name in ln
    ]
    return shlex.split(line)[1:]


async def test_pending_calls_are_the_current_details_and_their_commands_work(
    server: DevServer, client: Client, tq: str, bank: Bank, who: str
) -> None:
    async with build_worker(client, tq, [*WORKFLOWS, OwnDetailsAgent]):
        h = await client.start_workflow(
            OwnDetailsAgent.run,
            args=[bank.url, who],
            id=f"ui agent {uuid.uuid4().hex[:8]}",  # a space: the commands quote it
            task_queue=tq,
        )
        text = await eventually(lambda: details(h), lambda d: "transfer#2" in d)
        assert text.startswith(OWN_DETAILS + "\n\n### exactcall: 2 calls awaiting approval")
        reqs = {r.step: r for r in (await approvals.view(client, h.id)).pending}
        for n, amount in ((1, 10), (2, 20)):
            r = reqs[f"transfer#{n}"]
            assert r.args_hash == exactcall.intent_hash("transfer", bank.url, amount, who)
            cmds, wid = joined(text), shlex.quote(h.id)
            assert f"exactcall approve {wid} transfer#{n} --hash {r.args_hash}\n" in cmds
            assert f"exactcall deny {wid} transfer#{n} --hash {r.args_hash}" in cmds
            assert json.dumps(r.args, indent=2, sort_keys=True) in text
            assert f"**expires** {r.expires_at:%Y-%m-%dT%H:%M:%S}Z" in text
        # the person pastes the command from the page: it approves exactly that call
        argv = command_of(text, "approve", "transfer#1")
        rc, out, err = await cli(server, *argv, "--yes", "--as", "oncall")
        assert rc == 0, (out, err)
        text = await eventually(lambda: details(h), lambda d: "transfer#1" not in d)
        assert "### exactcall: 1 call awaiting approval" in text and "transfer#2" in text
        rc, out, err = await cli(server, *command_of(text, "deny", "transfer#2"), "--yes")
        assert rc == 0, (out, err)
        res = await h.result()
    assert res["results"][0]["ok"]["amount"] == 10 and res["results"][1] == {
        "error": "ApprovalDenied"
    }
    assert res["details"] == OWN_DETAILS  # exactcall's section is gone, the workflow's stays
    assert bank.count(to=who) == 1


async def test_an_expired_call_leaves_the_details(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    h = await start_agent(
        client, tq, plan(step("hasty_transfer", bank.url, 5, who), wait_signal=True)
    )
    text = await eventually(lambda: details(h), lambda d: "hasty_transfer#1" in d, timeout=2)
    assert "### exactcall: 1 call awaiting approval" in text
    assert await eventually(lambda: details(h), lambda d: d == "", timeout=10) == ""
    await h.terminate("done")


async def test_a_run_claims_summary_names_the_workflow_and_its_run(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    h = await start_agent(client, tq, plan(step("pay", bank.url, 7, who)))
    await h.result()
    desc = await client.get_workflow_handle(_runs.run_claim_id(h.id)).describe()
    assert desc.workflow_type == RUN_CLAIM_WORKFLOW
    assert await desc.static_summary() == f"run claim of workflow {h.id}: run {h.result_run_id}"


async def test_a_records_summary_names_the_call_and_its_input_is_the_intent(
    per_call: Client, tq: str, bank: Bank, who: str
) -> None:
    client = per_call  # a per-call record for every call (a run with the claim writes none)
    h = await start_agent(client, tq, plan(step("pay", bank.url, 7, who)))
    await h.result()
    key = exactcall.derive_key("default", h.id, "pay#1", "pay", "1")
    desc = await client.get_workflow_handle(record_id(key)).describe()
    args_hash = exactcall.intent_hash("pay", bank.url, 7, who)
    assert desc.workflow_type == RECORD_WORKFLOW == RECORD_WORKFLOW
    assert await desc.static_summary() == f"pay pay#1 of workflow {h.id}, args {args_hash[:8]}…"
    assert await desc.static_details() is None  # no copy of the intent: it is the input
    first = await anext(aiter(client.get_workflow_handle(record_id(key)).fetch_history_events()))
    [init] = await client.data_converter.decode(
        first.workflow_execution_started_event_attributes.input.payloads, [RecordInit]
    )
    i = init.intent
    assert (i.key, i.args_hash, i.workflow_id) == (key, args_hash, h.id)
    assert i.args == {"amount": 7, "bank": bank.url, "to": who}


async def test_a_long_workflow_id_is_cut_to_fit_the_summary(
    per_call: Client, tq: str, bank: Bank, who: str
) -> None:
    client = per_call
    wid = "ui-long-" + "x" * 900  # Temporal's API sets a summary's limit at 400 bytes
    h = await start_agent(client, tq, plan(step("pay", bank.url, 1, who)), wid=wid)
    await h.result()
    key = exactcall.derive_key("default", wid, "pay#1", "pay", "1")
    summary = await (await client.get_workflow_handle(record_id(key)).describe()).static_summary()
    assert summary is not None and summary.startswith("pay pay#1 of workflow ui-long-xxx")
    assert len(json.dumps(summary)) <= 400 and summary.endswith("…")
    claim = await (
        await client.get_workflow_handle(_runs.run_claim_id(wid)).describe()
    ).static_summary()
    assert claim is not None and claim.startswith("run claim of workflow ui-long-xxx")
    assert len(json.dumps(claim)) <= 400


async def test_a_parked_reconciliation_shows_why_and_how_to_resolve_it(
    server: DevServer, client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    h = await start_agent(client, tq, plan(step("ui_lost_pay", bank.url, 3, who)))
    key = exactcall.derive_key("default", h.id, "ui_lost_pay#1", "ui_lost_pay", "1")
    rec = client.get_workflow_handle(reconciliation.reconcile_id(key))
    text = await eventually(
        lambda: details(rec), lambda d: "unresolved: the outcome" in d, timeout=30
    )
    args_hash = exactcall.intent_hash("ui_lost_pay", bank.url, 3, who)
    head = "### exactcall: unresolved: the outcome of `ui_lost_pay ui_lost_pay#1` is unknown"
    assert head in text
    assert "ConnectionResetError" in text and f"`{key}`" in text and f"`{args_hash}`" in text
    for verdict in ("--landed", "--not-landed", "--abandon"):
        assert f"exactcall resolve {h.id} ui_lost_pay#1 {verdict}" in joined(text)
    desc = await rec.describe()
    assert await desc.static_summary() == (
        f"reconcile ui_lost_pay ui_lost_pay#1 of workflow {h.id}, args {args_hash[:8]}…"
    )
    assert "**why** the tool raised ConnectionResetError" in (await desc.static_details() or "")
    landed = command_of(text, "resolve", "--landed")
    at = landed.index("--result") + 1
    assert landed[at] == "<its result as JSON>"  # the person fills it in
    landed[at] = json.dumps({"payment_id": -1, "checked": "by hand"})
    rc, out, err = await cli(server, *landed, "--yes")
    assert rc == 0, (out, err)
    await h.result()
    assert await details(rec) == ""  # settled: nothing left for a person
    assert bank.count(to=who) == 1


async def listed(client: Client, query: str, tq: str) -> set[str]:
    return {wf.id async for wf in client.list_workflows(f"({query}) AND TaskQueue = '{tq}'")}


async def test_each_saved_view_lists_exactly_its_workflows(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str
) -> None:
    waiting = await start_agent(client, tq, plan(step("transfer", bank.url, 1, who)))
    parked = await start_agent(client, tq, plan(step("ui_lost_pay", bank.url, 1, who)))
    plain = await start_agent(client, tq, plan(step("pay", bank.url, 1, who)))
    gone = await start_agent(client, tq, plan(step("transfer", bank.url, 2, who)))
    gone_parked = await start_agent(client, tq, plan(step("ui_lost_pay", bank.url, 2, who)))
    await plain.result()
    await eventually(lambda: approvals.view(client, gone.id), lambda v: len(v.pending) == 1)
    await eventually(lambda: approvals.view(client, waiting.id), lambda v: len(v.pending) == 1)

    def rid(h: WorkflowHandle[Any, Any]) -> str:
        return reconciliation.reconcile_id(
            exactcall.derive_key("default", h.id, "ui_lost_pay#1", "ui_lost_pay", "1")
        )

    both_parked = lambda ids: {rid(parked), rid(gone_parked)} <= ids  # noqa: E731
    await eventually(lambda: listed(client, "ExactcallUnresolved = true", tq), both_parked, 30)
    # terminated while waiting: their last search attribute values stay, the views skip them
    await gone.terminate("gone")
    await client.get_workflow_handle(rid(gone_parked)).terminate("gone")
    await gone_parked.terminate("gone")
    own = {waiting.id, parked.id, plain.id, gone.id, gone_parked.id}
    want = {
        "Awaiting approval": {waiting.id},
        "Parked calls": {rid(parked)},
        "My workflows": own,
    }
    for name, query in SAVED_VIEWS.items():
        got = await eventually(
            lambda q=query: listed(client, q, tq), lambda ids, n=name: ids == want[n]
        )
        assert got == want[name], name
    everything = {wf.id async for wf in client.list_workflows(f"TaskQueue = '{tq}'")}
    assert len(everything - own) >= 5  # the records and reconciliations the last view hides
    # clean up: the agent first (ending its reconciliation first may end the agent by itself)
    for h in (waiting, parked, client.get_workflow_handle(rid(parked))):
        with contextlib.suppress(RPCError):  # already completed
            await h.terminate("done")
