"""The demo's tools: payments at the demo bank (``exactcall.demo.bank``).

Served by ``exactcall worker --tools exactcall.demo.tools`` (``exactcall demo`` and the
production compose file do that). Every tool takes the bank's base URL as its first argument.

* ``pay``: the bank dedupes on ``Idempotency-Key`` and exactcall sends the call's derived key,
  so a crashed attempt is re-sent with the same key and the bank replays its receipt;
* ``pay_probed``: sends the key so the bank records it, but is not declared provider
  idempotent; a call of unknown outcome is settled by its probe (:func:`find_payment`), which
  asks the bank ``GET /payments?idempotency_key=K``;
* ``pay_no_key``: the same payment without a key and without a probe, so a crash inside the
  call is parked for a person (``exactcall resolve``) instead of sent a second time;
* ``approved_pay``: waits for a person to approve its exact arguments before it runs;
* ``bare_pay``: a plain Temporal activity without exactcall, for comparison.

No side effects at import time.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

from temporalio import activity

import exactcall
from exactcall.demo.bank_client import post_payment, receipt_with_key

__all__ = [
    "CRASH_BARE_ENV",
    "approved_pay",
    "bare_pay",
    "find_payment",
    "pay",
    "pay_no_key",
    "pay_probed",
]

CRASH_BARE_ENV = "EXACTCALL_DEMO_CRASH_BARE"
"""Set (to anything non-empty) to SIGKILL the worker right after ``bare_pay``'s payment, in
the activity's first attempt (its retry on the next worker runs normally)."""

HEARTBEAT = timedelta(seconds=2)


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=HEARTBEAT)
async def pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay ``amount`` to ``to``; the bank dedupes on the call's idempotency key."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


def find_payment(intent: exactcall.Intent) -> Any:
    """Reconcile probe of ``pay_probed``: did the bank book a payment under the call's key?"""
    receipt = receipt_with_key(str(intent.args["bank"]), intent.key)
    if receipt is None:
        return exactcall.NotLanded()
    return exactcall.Landed({**receipt, "found_by": "probe"})  # the demo shows who settled it


@exactcall.tool(reconcile=find_payment, heartbeat_timeout=HEARTBEAT)
async def pay_probed(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay, sending the key so the bank records it (it is not trusted to dedupe): a call of
    unknown outcome is settled by asking the bank for the key (:func:`find_payment`)."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


@exactcall.tool(heartbeat_timeout=HEARTBEAT)
async def pay_no_key(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay without an idempotency key: the bank books every request it gets."""
    return await asyncio.to_thread(post_payment, bank, amount, to)


@exactcall.tool(approval=True, provider_idempotent=True, heartbeat_timeout=HEARTBEAT)
async def approved_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay once a person has approved these exact arguments (the bank dedupes the key)."""
    headers = exactcall.idempotency_headers()
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


@activity.defn(name="bare_pay")
async def bare_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A plain Temporal activity without exactcall: the way most agents call tools today."""
    receipt = await asyncio.to_thread(post_payment, bank, amount, to)
    if os.environ.get(CRASH_BARE_ENV) and activity.info().attempt == 1:
        # the demo's crash: the bank has answered, Temporal has not heard of it yet
        os.kill(os.getpid(), signal.SIGKILL)
    return receipt
