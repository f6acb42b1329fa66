"""exactcall.google_genai: the Google Gen AI SDK's automatic function calling on
``temporalio-google-genai`` (its own plugin and ``TemporalAsyncClient``, the model scripted by
its ``GeminiTestServer``) on a real dev server.

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

import exactcall
from exactcall import approvals
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.google_genai import tools
from exactcall.testing import WorkerProcess
from tests.agent_kit import (
    kit_approved_pay,
    kit_pay,
    paid,
    plain_twice_exactcall_once,
    prompt,
    the_pending_request,
    unknown_fails_the_run,
)
from tests.conftest import ROOT
from tests.genai_app import GenaiAgent, GenaiKeyedAgent, ScriptedGemini


@pytest.fixture(scope="module")
def gemini() -> ScriptedGemini:
    return ScriptedGemini()


@pytest.fixture(scope="module")
async def genai_client(server: DevServer, gemini: ScriptedGemini) -> Client:
    return await connect(Connection(address=server.address), others=[gemini.plugin()])


@pytest.fixture
async def genai_worker(genai_client: Client, tq: str) -> AsyncIterator[None]:
    async with build_worker(genai_client, tq, [GenaiAgent, GenaiKeyedAgent]):
        yield


async def run(client: Client, tq: str, text: str, wf: str = "GenaiAgent") -> tuple[str, str]:
    wid = f"genai-{uuid.uuid4().hex[:10]}"
    out = await client.execute_workflow(wf, text, id=wid, task_queue=tq, result_type=str)
    return wid, out


# -- the tool path -----------------------------------------------------------------------------
async def test_one_payment_under_a_step_key_the_model_sees_the_schema_and_the_receipt(
    genai_client: Client, genai_worker: None, gemini: ScriptedGemini, tq: str, bank: Bank, who: str
) -> None:
    before = len(gemini.requests)
    wid, text = await run(genai_client, tq, prompt(bank.url, ("kit_pay", 10, who)))
    key = exactcall.derive_key("default", wid, "kit_pay#1", "kit_pay", "1")
    assert text.startswith("kit_pay ok:") and key in text  # the bank's receipt, keyed by step
    assert paid(bank, who) == [10]
    first = gemini.requests[before]
    decls = [d for t in first["tools"] for d in t.get("functionDeclarations") or []]
    [pay] = [d for d in decls if d["name"] == "kit_pay"]
    assert pay["description"] == kit_pay.__doc__, pay
    props = pay["parameters_json_schema"]["properties"]
    assert set(props) == {"bank", "amount", "to"}  # no idempotency_key
    assert props["amount"]["type"] == "integer"


async def test_a_refusal_reaches_the_model_and_a_repeat_pays_nothing(
    genai_client: Client, genai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    calls = [("kit_pay", 10, who), ("kit_pay", 10, who), ("kit_pay", 99, who)]
    _, text = await run(genai_client, tq, prompt(bank.url, *calls), wf="GenaiKeyedAgent")
    first, repeat, other = text.splitlines()
    assert first.startswith("kit_pay ok:") and repeat == first  # the same step: its result
    assert other.startswith("kit_pay failed:") and "IntentConflict" in other
    assert paid(bank, who) == [10]


async def test_an_unknown_outcome_fails_the_run_and_never_reaches_the_model(
    genai_client: Client, genai_worker: None, gemini: ScriptedGemini, tq: str, bank: Bank, who: str
) -> None:
    # AFC hands any Exception to the model; a model told "it failed" would call again (a new
    # step, a new key) and may pay twice: the run fails, and the reconciliation goes on
    before = len(gemini.requests)
    wid = f"genai-lose-{uuid.uuid4().hex[:8]}"
    await unknown_fails_the_run(genai_client, "GenaiAgent", wid, tq, bank, who)
    assert len(gemini.requests) == before + 1  # no model turn saw the error


async def test_an_approval_is_listed_bound_to_the_hash_and_runs_once(
    genai_client: Client, genai_worker: None, tq: str, bank: Bank, who: str
) -> None:
    text = prompt(bank.url, ("kit_approved_pay", 10, who))
    wid = f"genai-{uuid.uuid4().hex[:10]}"
    handle = await genai_client.start_workflow(
        "GenaiAgent", text, id=wid, task_queue=tq, result_type=str
    )

    req = await the_pending_request(genai_client, wid)
    assert (req.step, req.tool) == ("kit_approved_pay#1", "kit_approved_pay")
    wrong = exactcall.intent_hash(kit_approved_pay, bank.url, 9999, "mallory")
    res = await approvals.approve(genai_client, wid, req.step, args_hash=wrong, by="ops")
    assert not res.accepted and res.outcome.startswith("hash mismatch")
    assert paid(bank, who) == []
    res = await approvals.approve(genai_client, wid, req.step, args_hash=req.args_hash, by="ops")
    assert res.accepted
    assert (await handle.result()).startswith("kit_approved_pay ok:")
    assert paid(bank, who) == [10]


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
        "tests.genai_app",
        plain="GenaiPlainAgent",
        exact="GenaiAgent",
    )


# -- bad use -----------------------------------------------------------------------------------
def test_bad_tool_lists_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="at least one exactcall tool"):
        tools()
    with pytest.raises(ValueError, match="listed twice"):
        tools(kit_pay, "kit_pay")
    with pytest.raises(ValueError, match="not one of its tools"):
        tools(kit_pay, key={"kit_approved_pay": lambda a: "x"})


def test_without_the_package_the_import_error_says_which_extra() -> None:
    code = (
        "import sys; sys.modules['temporalio.google_genai'] = None\nimport exactcall.google_genai\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "pip install 'exactcall[google-genai]'" in proc.stderr
