"""Tools and a plain Python program that pays through an ``exactcall.session`` (no workflow of
its own): ``tests/test_session.py`` runs it as a real process and SIGKILLs it.

``python -m tests.session_app SESSION BANK ACCOUNT [TOOL]`` pays 10 then 20 to ACCOUNT with
TOOL (steps ``TOOL#1``, ``TOOL#2``) and prints each receipt as a JSON line. With
``SESSION_APP_DIE=AMOUNT``, the tool SIGKILLs its own process right after the bank booked that
payment (before exactcall records the result). Temporal is ``TEMPORAL_ADDRESS``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow

import exactcall
from exactcall.demo.bank_client import post_payment, receipt_with_key

DIE_ENV = "SESSION_APP_DIE"
FAST = timedelta(seconds=2)


def _pay(bank: str, amount: int, to: str, headers: dict[str, str] | None) -> dict[str, Any]:
    receipt = post_payment(bank, amount, to, headers)
    if os.environ.get(DIE_ENV) == str(amount):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # paid; the result is not recorded yet
    return receipt


def find_payment(intent: exactcall.Intent) -> Any:
    """The probe: did the bank book a payment under the call's key?"""
    receipt = receipt_with_key(str(intent.args["bank"]), intent.key)
    if receipt is None:
        return exactcall.NotLanded()
    return exactcall.Landed({**receipt, "found_by": "probe"})


@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
async def session_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Sends the key so the bank records it; an unknown outcome is settled by its probe."""
    return await asyncio.to_thread(_pay, bank, amount, to, exactcall.idempotency_headers())


@exactcall.tool(heartbeat_timeout=FAST)
def session_pay_plain(bank: str, amount: int, to: str) -> dict[str, Any]:
    """No key, no probe: an unknown outcome waits for a person."""
    return _pay(bank, amount, to, None)


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
def session_pay_approved(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _pay(bank, amount, to, exactcall.idempotency_headers())


class Receipt(BaseModel):
    payment_id: int
    amount: int


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def session_pay_typed(bank: str, amount: int, to: str) -> Receipt:
    r = post_payment(bank, amount, to, exactcall.idempotency_headers())
    return Receipt(payment_id=r["payment_id"], amount=r["amount"])


SESSION_BUDGET = exactcall.Budget(
    "session-test", limit=15, per=timedelta(days=1), measure="amount", on_exceed="refuse"
)


@exactcall.tool(budgets=[SESSION_BUDGET], provider_idempotent=True, heartbeat_timeout=FAST)
def session_pay_budgeted(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post_payment(bank, amount, to, exactcall.idempotency_headers())


@workflow.defn(name="SessionInsideAWorkflow")
class SessionInsideAWorkflow:
    """Misuse: a session opened in workflow code."""

    @workflow.run
    async def run(self) -> None:
        async with exactcall.session("inside"):
            pass


def main(argv: list[str]) -> int:
    session_id, bank, account = argv[:3]
    tool = argv[3] if len(argv) > 3 else "session_pay"
    on_unknown = "raise" if "plain" in tool else None
    with exactcall.session_sync(session_id) as s:
        for amount in (10, 20):
            try:
                receipt = s.call(tool, bank, amount, account, on_unknown=on_unknown)
            except exactcall.ExactcallError as err:
                print(json.dumps({"error": err.code, "message": err.message}), flush=True)
                return 3
            print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
