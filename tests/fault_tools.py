"""Tools for the fault tests (tests/test_faults.py): each one notes that it was entered, waits
``seconds`` (the slow part before its effect, where a fault strikes), then pays at the real
local HTTP bank. The bank books every request of these (no Idempotency-Key) except
``fault_charge``'s, so a second effect shows as a second payment to the account."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import timedelta
from typing import Any

import exactcall
from exactcall.testing import record_effect
from tests.tools import post

FAST = timedelta(seconds=2)


def entered(to: str) -> None:
    record_effect(f"enter:{to}")


def _pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


def paid_to(intent: exactcall.Intent) -> Any:
    """Probe: a payment to the call's account (each test pays a fresh account)."""
    args = intent.args
    with urllib.request.urlopen(f"{args['bank']}/payments/count?to={args['to']}", timeout=10) as r:
        count = int(json.loads(r.read())["count"])
    return exactcall.Landed({"count": count}) if count else exactcall.NotLanded()


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
async def fault_book_async(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    entered(to)
    await asyncio.sleep(seconds)
    return _pay(bank, amount, to)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def fault_book_sync(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    entered(to)
    time.sleep(seconds)
    return _pay(bank, amount, to)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def fault_book_sync_checked(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """Checks its claim right before paying."""
    entered(to)
    time.sleep(seconds)
    exactcall.check_claim()
    return _pay(bank, amount, to)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
async def fault_book_checked(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """Its effect runs in a thread (which cancelling the tool does not stop); the thread
    checks the claim right before paying."""

    def work() -> dict[str, Any]:
        time.sleep(seconds)
        exactcall.check_claim()
        return _pay(bank, amount, to)

    entered(to)
    return await asyncio.to_thread(work)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
async def fault_book_finishing(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """Told to stop, it finishes the request it had begun: the payment lands 2.5 s later."""
    entered(to)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.to_thread(time.sleep, 2.5)
        _pay(bank, amount, to)
        raise
    return _pay(bank, amount, to)


@exactcall.tool(heartbeat_timeout=FAST)
async def fault_book_plain(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """No probe; its request, once begun, is finished even if the tool is cancelled (it
    shields it): a late effect, whose result the late attempt records."""

    def work() -> dict[str, Any]:
        time.sleep(seconds)
        return _pay(bank, amount, to)

    entered(to)
    request = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(request)
    except asyncio.CancelledError:
        return await request


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def fault_charge(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """The bank dedupes on the key: a late request is replayed, not booked."""
    entered(to)
    time.sleep(seconds)
    body = {"amount": amount, "to": to}
    return post(bank, "/payments", body, exactcall.idempotency_headers())


@exactcall.tool(heartbeat_timeout=FAST)
def claim_left(bank: str, to: str) -> float:
    """How long its claim holds, by check_claim() (a healthy worker: most of the timeout)."""
    left = exactcall.check_claim()
    _pay(bank, 1, to)
    return left


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def pay_unless_cancelled(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Waits (up to 20 s) until its call is cancelled, then checks its claim before paying."""
    from temporalio import activity

    entered(to)
    deadline = time.monotonic() + 20
    while not activity.is_cancelled() and time.monotonic() < deadline:
        time.sleep(0.05)
    exactcall.check_claim()
    return _pay(bank, amount, to)


# -- through the chaos proxy (tests/test_provider_faults.py): ``via`` is the proxy in front of
# the bank, which loses the answer after the bank committed; ``timeout``: the tool's own
@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def via_charge(bank: str, via: str, amount: int, to: str, timeout: float) -> dict[str, Any]:
    body = {"amount": amount, "to": to}
    return post(via, "/payments", body, exactcall.idempotency_headers(), timeout)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def via_book(bank: str, via: str, amount: int, to: str, timeout: float) -> dict[str, Any]:
    """No key: the bank books every request it gets; the probe asks the bank itself."""
    return post(via, "/payments", {"amount": amount, "to": to}, timeout=timeout)


@exactcall.tool(heartbeat_timeout=FAST)
def via_pay(bank: str, via: str, amount: int, to: str, timeout: float) -> dict[str, Any]:
    """No key, no probe: an unknown outcome waits for a person."""
    return post(via, "/payments", {"amount": amount, "to": to}, timeout=timeout)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def fault_pay_then_wait(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """Pays at once, then stays in the tool ``seconds`` (a fault after the effect)."""
    receipt = _pay(bank, amount, to)
    time.sleep(seconds)
    return receipt


# -- a provider that commits a request after the tool gave up on it (its own ``timeout``)
@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST)
def book_late(bank: str, amount: int, to: str, timeout: float) -> dict[str, Any]:
    """A probe, but the probe's "not landed" is trusted as soon as the claim is gone."""
    return post(bank, "/payments", {"amount": amount, "to": to}, timeout=timeout)


@exactcall.tool(reconcile=paid_to, heartbeat_timeout=FAST, late_commit=timedelta(seconds=6))
def book_late_declared(bank: str, amount: int, to: str, timeout: float) -> dict[str, Any]:
    """The same, with ``late_commit`` longer than the bank's lag past the tool's timeout."""
    return post(bank, "/payments", {"amount": amount, "to": to}, timeout=timeout)
