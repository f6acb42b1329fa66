"""What every framework's quickstart agent shares: the payment, its probe, and the crash.

No framework is imported here. Each ``exactcall.quickstart.<framework>`` module defines two
agents that pay once through the demo bank (``exactcall.demo.bank``): ``PlainAgent``, on the
framework's own Temporal integration with the payment as a plain activity, and
``ExactcallAgent``, the same agent with the payment through exactcall. ``exactcall
quickstart`` SIGKILLs the worker right after the payment, in both, and counts payments at the
bank.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from temporalio import activity

import exactcall
from exactcall.demo.bank_client import payments_with_key, post_payment

__all__ = ["CRASH_PLAIN_ENV", "crash_after_plain_effect", "find_payment", "pay_at_bank"]

CRASH_PLAIN_ENV = "EXACTCALL_QUICKSTART_CRASH_PLAIN"
"""Set (non-empty): a plain activity's first attempt SIGKILLs its worker right after paying."""


async def pay_at_bank(bank: str, amount: int, to: str, key: str | None = None) -> dict[str, Any]:
    """``POST /payments`` (with ``Idempotency-Key: key`` when given); the bank's receipt."""
    headers = {"Idempotency-Key": key} if key else None
    return await asyncio.to_thread(post_payment, bank, amount, to, headers)


def crash_after_plain_effect() -> None:
    """Inside a plain activity, right after its effect: the quickstart's crash."""
    if os.environ.get(CRASH_PLAIN_ENV) and activity.info().attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def find_payment(intent: exactcall.Intent) -> exactcall.Landed | exactcall.NotLanded:
    """The reconciliation probe: did the bank book a payment under this call's key?"""
    rows = payments_with_key(intent.args["bank"], intent.key)
    return exactcall.Landed(rows[0]) if rows else exactcall.NotLanded()
