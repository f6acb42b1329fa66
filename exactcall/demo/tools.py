"""The demo's tools: payments at the demo bank (``exactcall.demo.bank``).

Served by ``exactcall worker --tools exactcall.demo.tools`` (``exactcall demo`` and the
production compose file do that). Every tool takes the bank's base URL as its first argument.

* ``pay``: the bank dedupes on ``Idempotency-Key`` and exactcall sends the call's derived key,
  so a crashed attempt is re-sent with the same key and the bank replays its receipt;
* ``pay_no_key``: the same payment without a key (a destination that cannot dedupe), so a
  crash inside the call ends as ``AmbiguousOutcome`` instead of a second payment;
* ``bare_pay``: a plain Temporal activity without exactcall, for comparison.

No side effects at import time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from datetime import timedelta
from typing import Any

from temporalio import activity

import exactcall

__all__ = ["CRASH_BARE_ENV", "bare_pay", "pay", "pay_no_key"]

CRASH_BARE_ENV = "EXACTCALL_DEMO_CRASH_BARE"
"""Set (to anything non-empty) to SIGKILL the worker right after ``bare_pay``'s payment."""

HEARTBEAT = timedelta(seconds=2)
HTTP_TIMEOUT = 30.0


def _post_payment(
    bank: str, amount: int, to: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """``POST {bank}/payments``; return the bank's JSON receipt (HTTP errors raise)."""
    req = urllib.request.Request(
        f"{bank.rstrip('/')}/payments",
        data=json.dumps({"amount": amount, "to": to}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
        receipt: dict[str, Any] = json.loads(resp.read())
    return receipt


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=HEARTBEAT)
async def pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay ``amount`` to ``to``; the bank dedupes on the call's idempotency key."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(_post_payment, bank, amount, to, headers)


@exactcall.tool(heartbeat_timeout=HEARTBEAT)
async def pay_no_key(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay without an idempotency key: the bank books every request it gets."""
    return await asyncio.to_thread(_post_payment, bank, amount, to)


@activity.defn(name="bare_pay")
async def bare_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A plain Temporal activity without exactcall: the way most agents call tools today."""
    receipt = await asyncio.to_thread(_post_payment, bank, amount, to)
    if os.environ.get(CRASH_BARE_ENV):
        # the demo's crash: the bank has answered, Temporal has not heard of it yet
        os.kill(os.getpid(), signal.SIGKILL)
    return receipt
