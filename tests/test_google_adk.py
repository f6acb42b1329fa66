"""exactcall.google_adk: Google ADK agents on ``temporalio-google-adk`` (its own plugin,
``TemporalModel`` and HITL helpers; the model a scripted ``BaseLlm``) on a real dev server.

Effects are counted at the real local HTTP bank; crashes are real worker processes SIGKILLed
right after the payment.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from temporalio.client import Client
from temporalio.google_adk import GoogleAdkPlugin

import exactcall
from exactcall import approvals
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.google_adk import tools
from exactcall.testing import WorkerProcess
from tests.adk_app import AdkAgent, AdkKeyedAgent
from tests.agent_kit import (
    kit_held_pay,
    kit_pay,
    paid,
    plain_twice_exactcall_once,
    prompt,
    the_pending_request,
    unknown_fails_the_run,
)
from tests.conftest import ROOT


@pytest.fixture(scope="module")
async def adk_client(server: DevServer) -> Client:
    return await connect(Connection(address=server.address), others=[GoogleAdkPlugin()])


@pytest.fixture
async def adk_worker(adk_client: Client, tq: str) -> AsyncIterator[None]:
    async with build_worker(adk_client, tq, [AdkAgent, AdkKeyedAgent]):
        yield


async def run(client: Client, tq: str, text: str, *args: str, wf: str = "AdkAgent") -> str:
    wid = f"adk-{uuid.uuid4().hex[:10]}"
    return await client.execute_workflow(
        wf, args=[text, *args], id=wid, task_queue=tq, result_type=str
    )


# -- the tool path -----------------------------------------------------------------------------
async def test_one_payment_under_a_step_key_and_the_model_reads_the_receipt(
    adk_client: Client, adk_worker: None, tq: str, bank: Bank, who: str
) -> None:
    wid = f"adk-{uuid.uuid4().hex[:10]}"
    text = await adk_client.execute_workflow(
        "AdkAgent", prompt(bank.url, ("kit_pay", 10, who)), id=wid, task_queue=tq, result_type=str
    )
    key = exactcall.derive_key("default", wid, "kit_pay#1", "kit_pay", "1")
    assert text.startswith("kit_pay ok:") and key in text  # the bank's receipt, keyed by step
    assert paid(bank, who) == [10]


def test_the_model_sees_the_signature_without_the_key_and_the_docstring() -> None:
    [pay] = tools(kit_pay)
    decl = pay._get_declaration()
    assert decl is not None and decl.name == "kit_pay"
    assert decl.description == kit_pay.__doc__
    schema = decl.parameters_json_schema or decl.parameters.model_dump(exclude_none=True)
    assert set(schema["properties"]) == {"bank", "amount", "to"}  # no key, no tool_context


async def test_a_refusal_reaches_the_model_and_a_repeat_pays_nothing(
    adk_client: Client, adk_worker: None, tq: str, bank: Bank, who: str
) -> None:
    calls = [("kit_pay", 10, who), ("kit_pay", 10, who), ("kit_pay", 99, who)]
    text = await run(adk_client, tq, prompt(bank.url, *calls), wf="AdkKeyedAgent")
    first, repeat, other = text.splitlines()
    assert first.startswith("kit_pay ok:") and repeat == first  # the same step: its result
    assert other.startswith("kit_pay failed:") and "IntentConflict" in other
    assert paid(bank, who) == [10]


async def test_an_unknown_outcome_fails_the_run_and_never_reaches_the_model(
    adk_client: Client, adk_worker: None, tq: str, bank: Bank, who: str
) -> None:
    wid = f"adk-lose-{uuid.uuid4().hex[:8]}"
    await unknown_fails_the_run(adk_client, "AdkAgent", wid, tq, bank, who)


# -- ADK's require_confirmation, bound to the hash ---------------------------------------------
async def test_a_confirmation_is_listed_bound_to_the_hash_and_runs_once(
    adk_client: Client, adk_worker: None, tq: str, bank: Bank, who: str
) -> None:
    wid = f"adk-{uuid.uuid4().hex[:10]}"
    handle = await adk_client.start_workflow(
        "AdkAgent",
        prompt(bank.url, ("kit_held_pay", 10, who)),
        id=wid,
        task_queue=tq,
        result_type=str,
    )

    req = await the_pending_request(adk_client, wid)
    assert req.tool == "kit_held_pay" and req.step.startswith("kit_held_pay@")
    assert req.args_hash == exactcall.intent_hash(kit_held_pay, bank.url, 10, who)
    wrong = exactcall.intent_hash(kit_held_pay, bank.url, 9999, "mallory")
    res = await approvals.approve(adk_client, wid, req.step, args_hash=wrong, by="ops")
    assert not res.accepted and res.outcome.startswith("hash mismatch")
    assert paid(bank, who) == []
    res = await approvals.approve(adk_client, wid, req.step, args_hash=req.args_hash, by="ops")
    assert res.accepted
    assert (await handle.result()).startswith("kit_held_pay ok:")
    assert paid(bank, who) == [10]


async def test_a_plain_yes_without_the_hash_releases_nothing(
    adk_client: Client, adk_worker: None, tq: str, bank: Bank, who: str
) -> None:
    text = await run(adk_client, tq, prompt(bank.url, ("kit_held_pay", 10, who)), "plain-yes")
    assert text.startswith("kit_held_pay failed:") and "ApprovalMissing" in text
    assert paid(bank, who) == []


# -- a real SIGKILL right after the payment: plain 2 effects, exactcall 1 -----------------------
@pytest.mark.crash
async def test_killed_after_the_payment_plain_pays_twice_exactcall_once(
    crash_at: Callable[..., Awaitable[WorkerProcess]],
    client: Client,
    exactcall_task_queue: str,
    bank: Bank,
) -> None:
    await plain_twice_exactcall_once(
        crash_at,
        client,
        exactcall_task_queue,
        bank,
        "tests.adk_app",
        plain="AdkPlainAgent",
        exact="AdkAgent",
    )


# -- bad use -----------------------------------------------------------------------------------
def test_bad_tool_lists_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="at least one exactcall tool"):
        tools()
    with pytest.raises(ValueError, match="listed twice"):
        tools(kit_pay, "kit_pay")
    with pytest.raises(ValueError, match="not among"):
        tools(kit_pay, require_confirmation=["kit_held_pay"])


def test_without_the_package_the_import_error_says_which_extra() -> None:
    code = "import sys; sys.modules['temporalio.google_adk'] = None\nimport exactcall.google_adk\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "pip install 'exactcall[google-adk]'" in proc.stderr
