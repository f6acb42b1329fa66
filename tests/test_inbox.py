"""The web inbox in headless Chromium, against a real server, worker, bank and webhook receiver.

The inbox runs as its own process (``exactcall inbox``), as an approver would reach it; the
effects are counted at the bank, and the notifications at a real local HTTP receiver.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from temporalio.client import Client, WorkflowFailureError

import exactcall
from exactcall import approvals
from exactcall._worker import Connection, build_worker, connect
from exactcall.cli._main import main
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.inbox import issue_token
from tests.conftest import WORKFLOWS, plan, start_agent, step
from tests.inbox_app import InboxProcess, Receiver, chromium, login
from tests.inbox_workflow import Replan
from tests.test_approvals import eventually, pending_of

APPROVERS = ("alice", "bob", "carol", "dave")
ALICE_KEY = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def inbox(
    server: DevServer, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[InboxProcess, dict[str, str]]]:
    d = tmp_path_factory.mktemp("inbox")
    tokens = {name: issue_token(d / "tokens.json", name) for name in APPROVERS}
    (d / "keys").mkdir()
    pem = ALICE_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    (d / "keys" / "alice.key.pem").write_bytes(pem)  # the inbox holds alice's key, not bob's
    p = InboxProcess(
        server.address,
        "--keys-dir",
        str(d / "keys"),
        "--tokens",
        str(d / "tokens.json"),
        "--notify-url",
        receiver.url,
        "--notify-state",
        str(d / "notified.json"),
        "--notify-interval",
        "0.3",
    )
    try:
        yield p.wait_ready(), tokens
    finally:
        p.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as b:
        yield b


@pytest.fixture
async def inbox_worker(client: Client, tq: str) -> AsyncIterator[None]:
    async with build_worker(client, tq, [*WORKFLOWS, Replan]):
        yield None


async def test_an_approver_sees_a_call_arrive_live_approves_it_and_it_runs_once(
    client: Client,
    inbox_worker: None,
    inbox: Any,
    browser: Any,
    receiver: Receiver,
    bank: Bank,
    who: str,
    tq: str,
) -> None:
    proc, tokens = inbox
    page = await login(browser, proc.url, tokens["alice"])
    assert await page.inner_text("#me") == "alice"
    await page.evaluate("window.notReloaded = true")
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    row = f'tr.pending[data-wf="{handle.id}"]'
    await page.wait_for_selector(row, timeout=20_000)  # by the page's own polling
    assert await page.evaluate("window.notReloaded") is True
    assert who in await page.inner_text(row)
    await page.click(f"{row} a")
    expected = exactcall.intent_hash("transfer", bank.url, 10, who)
    assert await page.inner_text("#hash") == expected
    assert f'"to": "{who}"' in await page.inner_text("#args")
    await page.fill("input[name=reason]", "customer refund, ticket 42")
    await page.click("#approve")
    assert await page.inner_text("#answer-title") == "Approved"
    out = await handle.result()
    assert out[0]["ok"]["to"] == who
    assert bank.count(to=who) == 1
    v = await approvals.view(client, handle.id)
    assert [(r.decision.by, r.decision.reason) for r in v.decisions if r.accepted] == [
        ("alice", "customer refund, ticket 42")
    ]
    # notifications: one approval_requested, then decided and settled
    await eventually(
        lambda: asyncio.sleep(0, receiver.events(handle.id, "call_settled")), lambda e: len(e) == 1
    )
    requested = receiver.events(handle.id, "approval_requested")
    assert len(requested) == 1
    assert requested[0]["args_hash"] == expected and requested[0]["step"] == "transfer#1"
    assert requested[0]["link"].startswith(proc.url + "/call?")
    decided = receiver.events(handle.id, "approval_decided")
    assert [(e["details"]["decision"], e["details"]["approved_by"]) for e in decided] == [
        ("approved", ["alice"])
    ]
    assert receiver.events(handle.id, "call_settled")[0]["details"]["outcome"] == "done"
    # the run's read-only view
    await page.goto(f"{proc.url}/run?wf={handle.id}")
    assert "done" in await page.inner_text("#calls")
    await page.screenshot(path=str(Path("/tmp/inbox-run.png")))
    await page.context.close()


async def test_a_stale_page_approving_after_the_arguments_changed_runs_nothing(
    client: Client,
    inbox_worker: None,
    inbox: Any,
    browser: Any,
    receiver: Receiver,
    bank: Bank,
    who: str,
    tq: str,
) -> None:
    proc, tokens = inbox
    handle = await client.start_workflow(
        Replan.run, args=[bank.url, 10, who], id=f"replan-{uuid.uuid4().hex[:10]}", task_queue=tq
    )
    first = await pending_of(client, handle)
    page = await login(browser, proc.url, tokens["alice"])
    await page.goto(f"{proc.url}/call?wf={handle.id}&step=pay")
    assert await page.inner_text("#hash") == first.args_hash
    await handle.signal(Replan.replan, 9999)  # the agent replaces the call: 9999, same step
    changed = await eventually(
        lambda: approvals.view(client, handle.id),
        lambda v: [r.args["amount"] for r in v.pending] == [9999],
    )
    await page.wait_for_selector("#changed", timeout=15_000)  # the open page says so, live
    await page.click("#approve")  # the stale tab approves anyway
    assert await page.inner_text("#answer-title") == "The call changed"
    assert "Nothing was sent" in await page.inner_text("#answer")
    v = await approvals.view(client, handle.id)
    assert v.pending == changed.pending  # still waiting, nothing decided
    assert not any(r.accepted for r in v.decisions)
    assert bank.count(to=who) == 0
    # one approval_requested per call: the first and its replacement
    requested = await eventually(
        lambda: asyncio.sleep(0, receiver.events(handle.id, "approval_requested")),
        lambda e: len(e) == 2,
    )
    hashes = [first.args_hash, changed.pending[0].args_hash]
    assert sorted(e["args_hash"] for e in requested) == sorted(hashes)
    await approvals.deny(
        client, handle.id, "pay", args_hash=changed.pending[0].args_hash, by="ops", reason="test"
    )
    with pytest.raises(WorkflowFailureError):  # ApprovalDenied: the agent does not catch it
        await handle.result()
    assert bank.count(to=who) == 0
    await page.context.close()


async def test_two_browsers_approving_at_once_give_one_effect(
    client: Client, inbox_worker: None, inbox: Any, browser: Any, bank: Bank, who: str, tq: str
) -> None:
    proc, tokens = inbox
    handle = await start_agent(client, tq, plan(step("transfer", bank.url, 10, who)))
    await pending_of(client, handle)
    async with chromium() as second:  # another browser process, another person
        pages = [
            await login(browser, proc.url, tokens["alice"]),
            await login(second, proc.url, tokens["bob"]),
        ]
        for p in pages:
            await p.goto(f"{proc.url}/call?wf={handle.id}&step=transfer%231")
        await asyncio.gather(*(p.dblclick("#approve") for p in pages))  # at once, and double
        answers = [
            (await p.inner_text("#answer-title"), await p.inner_text("#answer")) for p in pages
        ]
    assert sorted(t for t, _ in answers)[0] == "Approved", answers
    loser = sorted(answers)[1]  # told plainly that someone else decided first
    assert loser[0] in ("Not waiting any more", "Refused") and "already" in loser[1], answers
    await handle.result()
    assert bank.count(to=who) == 1
    v = await approvals.view(client, handle.id)
    assert sum(r.accepted for r in v.decisions) == 1


async def test_m_of_n_from_the_page_with_the_groups_enforced_by_the_worker(
    client: Client, inbox_worker: None, inbox: Any, browser: Any, bank: Bank, who: str, tq: str
) -> None:
    """wire: two of alice, bob and carol, never the requester (bob asked)."""
    proc, tokens = inbox
    handle = await client.start_workflow(
        "Agent",
        plan(step("wire", bank.url, 500, who)),
        id=f"wire-{uuid.uuid4().hex[:10]}",
        task_queue=tq,
        memo={approvals.REQUESTED_BY_MEMO: "bob"},
    )
    req = await pending_of(client, handle)
    url = f"{proc.url}/call?wf={handle.id}&step=wire%231"

    async def decide_as(name: str) -> tuple[str, str]:
        page = await login(browser, proc.url, tokens[name])
        await page.goto(url)
        await page.click("#approve")
        out = (await page.inner_text("#answer-title"), await page.inner_text("#answer"))
        await page.context.close()
        return out

    assert await decide_as("dave") == (
        "Refused",
        "The workflow refused it: dave is not an approver of wire. Nothing ran because of it.",
    )
    title, text = await decide_as("bob")
    assert (title, "the requester may not approve their own call" in text) == ("Refused", True)
    assert (await decide_as("alice"))[0] == "Approval 1 of 2 recorded"
    page = await login(browser, proc.url, tokens["carol"])
    row = f'tr.pending[data-wf="{handle.id}"]'
    await page.wait_for_selector(row)
    assert "1 of 2 approvals (alice)" in await page.inner_text(row)
    assert "asked by" not in (
        await page.inner_text(row)
    ).lower() and "bob" in await page.inner_text(row)
    await page.context.close()
    assert bank.count(to=who) == 0
    assert (await decide_as("carol"))[0] == "Approved"
    out = await handle.result()
    assert out[0]["ok"]["to"] == who and bank.count(to=who) == 1
    assert req.approvals_needed == 2


async def test_a_forged_identity_header_without_the_proxy_is_refused(
    server: DevServer, browser: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    secret = "s3cret-" + uuid.uuid4().hex
    p = InboxProcess(
        server.address, "--auth", "proxy", env={"EXACTCALL_INBOX_PROXY_SECRET": secret}
    )
    try:
        p.wait_ready()
        for headers in (
            {"X-Forwarded-User": "alice"},  # straight to the inbox, not through the proxy
            {"X-Forwarded-User": "alice", "X-Exactcall-Proxy-Secret": "guess"},
        ):
            ctx = await browser.new_context(extra_http_headers=headers)
            page = await ctx.new_page()
            resp = await page.goto(p.url + "/")
            assert resp is not None and resp.status == 401
            assert await page.inner_text("h1") == "Not signed in"
            assert "alice" not in await page.content()
            resp = await page.goto(p.url + "/pending.part")
            assert resp is not None and resp.status == 401
            await ctx.close()
        proxied = {"X-Forwarded-User": "alice", "X-Exactcall-Proxy-Secret": secret}
        ctx = await browser.new_context(extra_http_headers=proxied)
        page = await ctx.new_page()
        resp = await page.goto(p.url + "/")
        assert resp is not None and resp.status == 200
        assert await page.inner_text("#me") == "alice"
        await ctx.close()
    finally:
        p.stop()
    # without a configured secret, header mode does not start at all
    monkeypatch.setenv("EXACTCALL_INBOX_PROXY_SECRET", "")
    assert main(["inbox", "--auth", "proxy", "--address", server.address]) == 2
    assert "needs the proxy's shared secret" in capsys.readouterr().err


async def test_cross_site_and_tokenless_posts_are_refused(inbox: Any, browser: Any) -> None:
    proc, tokens = inbox
    page = await login(browser, proc.url, tokens["alice"])
    cookie = (await page.context.cookies())[0]
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
    # a form on the inbox's own page without its CSRF token (as another site would post it)
    status = await page.evaluate(
        """async () => (await fetch('/decide', {method: 'POST', body: new URLSearchParams(
            {wf: 'w', step: 's', hash: 'h', decision: 'approve'})})).status"""
    )
    assert status == 403
    req = page.context.request  # with the session cookie, from another origin
    resp = await req.post(
        proc.url + "/decide",
        form={"wf": "w", "step": "s", "hash": "h", "decision": "approve"},
        headers={"Origin": "http://evil.example"},
    )
    assert resp.status == 403 and "cross-site request from http://evil.example" in await resp.text()
    await page.context.close()
    anon = await browser.new_context()
    resp = await anon.request.get(proc.url + "/pending.part")
    assert resp.status == 401
    await anon.close()


async def test_signed_decisions_from_the_page_with_the_key_the_inbox_holds(
    server: DevServer, inbox: Any, browser: Any, bank: Bank, who: str, tq: str
) -> None:
    bob = Ed25519PrivateKey.generate()
    keys = {"alice": ALICE_KEY.public_key(), "bob": bob.public_key()}
    signed = await connect(Connection(address=server.address), exactcall.Plugin(approver_keys=keys))
    proc, tokens = inbox
    async with build_worker(signed, tq, WORKFLOWS):
        handle = await start_agent(signed, tq, plan(step("transfer", bank.url, 10, who)))
        await pending_of(signed, handle)
        url = f"{proc.url}/call?wf={handle.id}&step=transfer%231"
        page = await login(browser, proc.url, tokens["bob"])  # the inbox has no key of bob's
        await page.goto(url)
        assert "holds no key for you" in await page.inner_text("main")
        await page.click("#approve")
        assert await page.inner_text("#answer-title") == "Refused"
        text = await page.inner_text("#answer")
        assert "unsigned: this worker requires signed decisions" in text
        assert f"exactcall approve {handle.id} transfer#1 --hash" in text and "--as bob" in text
        assert bank.count(to=who) == 0
        # bob signs in his browser (WebCrypto Ed25519) with alice's key file: refused
        await page.goto(url)
        await page.set_input_files("#keyfile", str(keyfile("alice", ALICE_KEY)))
        await page.click("#approve")
        assert await page.inner_text("#answer-title") == "Refused"
        assert "signature does not verify with bob's key" in await page.inner_text("#answer")
        await page.context.close()
        assert bank.count(to=who) == 0
        page = await login(browser, proc.url, tokens["alice"])
        await page.goto(url)
        assert "signed with your key" in await page.inner_text("main")
        await page.click("#approve")
        assert await page.inner_text("#answer-title") == "Approved"
        await page.context.close()
        await handle.result()
        v = await approvals.view(signed, handle.id)  # answered by the worker
    assert bank.count(to=who) == 1
    (ok,) = [r for r in v.decisions if r.accepted]
    assert ok.decision.by == "alice" and ok.decision.signature

    # bob with his own key file, signing in the browser: the key never leaves it
    async with build_worker(signed, tq, WORKFLOWS):
        handle = await start_agent(signed, tq, plan(step("transfer", bank.url, 11, who)))
        await pending_of(signed, handle)
        page = await login(browser, proc.url, tokens["bob"])
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.post_data or "") if r.method == "POST" else None)
        await page.goto(f"{proc.url}/call?wf={handle.id}&step=transfer%231")
        await page.set_input_files("#keyfile", str(keyfile("bob", bob)))
        await page.click("#approve")
        assert await page.inner_text("#answer-title") == "Approved"
        await page.context.close()
        await handle.result()
        v = await approvals.view(signed, handle.id)
    assert bank.count(to=who) == 2
    (ok,) = [r for r in v.decisions if r.accepted]
    assert ok.decision.by == "bob" and ok.decision.signature
    assert len(sent) == 1 and "PRIVATE" not in sent[0] and "signature=" in sent[0]


def keyfile(name: str, key: Ed25519PrivateKey) -> Path:
    """An approver's private key as `exactcall keys new` writes it (PKCS#8 PEM)."""
    path = Path(tempfile.mkdtemp(prefix="inbox-key-")) / f"{name}.key.pem"
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path


async def test_an_expired_call_gets_a_clear_answer_and_nothing_runs(
    client: Client, inbox_worker: None, inbox: Any, browser: Any, bank: Bank, who: str, tq: str
) -> None:
    proc, tokens = inbox
    handle = await start_agent(client, tq, plan(step("hasty_transfer", bank.url, 10, who)))
    await pending_of(client, handle)  # it waits 2 s at most
    page = await login(browser, proc.url, tokens["alice"])
    await page.goto(f"{proc.url}/call?wf={handle.id}&step=hasty_transfer%231")
    await page.wait_for_selector("#gone", timeout=15_000)  # the open page sees it go
    await page.click("#approve")
    assert await page.inner_text("#answer-title") == "Not waiting any more"
    assert await page.inner_text("#answer") == "It no longer waits: expired. Nothing was sent."
    await page.context.close()
    out = await handle.result()
    assert out[0]["error"] == "ApprovalExpired" and bank.count(to=who) == 0
