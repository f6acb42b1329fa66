"""Tools used by the tests: each one moves money at a real local HTTP bank."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.common import RetryPolicy

import exactcall

FAST = timedelta(seconds=2)


class BankUnavailable(Exception):
    """The bank refused the request before doing anything (503)."""


def post(
    bank: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Any:
    req = urllib.request.Request(
        bank + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            if err.code == 503:
                raise BankUnavailable(f"bank answered {err.code}") from None
            raise


@exactcall.tool(heartbeat_timeout=FAST)
def pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Sync tool; sends NO key, so the bank would book every request."""
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
async def charge(bank: str, amount: int, customer: str) -> dict[str, Any]:
    """Async tool against a provider that dedupes on Idempotency-Key."""
    body = {"amount": amount, "to": customer}
    return await asyncio.to_thread(post, bank, "/payments", body, exactcall.idempotency_headers())


@exactcall.tool(
    heartbeat_timeout=FAST,
    not_executed_on=(BankUnavailable,),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=4),
)
def pay_or_retry(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """A 503 from the bank means nothing happened: exactcall may retry it."""
    return post(bank, "/payments", {"amount": amount, "to": to, "memo": idempotency_key})


@exactcall.tool(heartbeat_timeout=FAST)
def pay_then_explode(bank: str, amount: int, to: str) -> dict[str, Any]:
    post(bank, "/payments", {"amount": amount, "to": to})
    raise RuntimeError("connection reset after the request was sent")


@exactcall.tool(heartbeat_timeout=FAST)
def pay_unserializable(bank: str, amount: int, to: str) -> Any:
    post(bank, "/payments", {"amount": amount, "to": to})
    return object()


@exactcall.tool(heartbeat_timeout=FAST)
async def slow_pay(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    receipt = await asyncio.to_thread(post, bank, "/payments", {"amount": amount, "to": to})
    await asyncio.sleep(seconds)
    return receipt


@exactcall.tool(heartbeat_timeout=FAST)
def blocking_pay(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """A sync tool that blocks its thread for a long time (heartbeats must go on)."""
    receipt = post(bank, "/payments", {"amount": amount, "to": to})
    time.sleep(seconds)
    return receipt


@exactcall.tool(read_only=True)
def balance(bank: str, to: str) -> int:
    with urllib.request.urlopen(f"{bank}/payments/count?to={to}", timeout=10) as resp:
        return int(json.loads(resp.read())["count"])


@exactcall.tool(heartbeat_timeout=FAST)
def whoami(bank: str, to: str, key: str = "k") -> dict[str, Any]:
    """Has its own parameter called ``key``; reports what exactcall told it."""
    post(bank, "/payments", {"amount": 1, "to": to})
    intent = exactcall.current_intent()
    return {
        "key_param": key,
        "idempotency_key": exactcall.idempotency_key(),
        "headers": exactcall.idempotency_headers(),
        "step": intent.step,
        "args_hash": intent.args_hash,
    }


@exactcall.tool(name="pay_v2", version="2", heartbeat_timeout=FAST)
def pay_versioned(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


@activity.defn(name="bare_pay")
def bare_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A plain Temporal activity with no exactcall: what most agents do today."""
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
def transfer(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Needs a person's approval of its exact arguments."""
    return post(bank, "/payments", {"amount": amount, "to": to})


def over_100(intent: exactcall.Intent) -> bool:
    return int(intent.args["amount"]) > 100


@exactcall.tool(approval=over_100, heartbeat_timeout=FAST)
def refund(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Needs approval only above 100."""
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(approval=True, approval_timeout=timedelta(seconds=2), heartbeat_timeout=FAST)
def hasty_transfer(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(
    approval=True,
    approvers=["alice", "bob", "carol"],
    min_approvals=2,
    requester_may_approve=False,
    heartbeat_timeout=FAST,
)
def wire(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Two of alice, bob and carol must approve, and never the requester."""
    return post(bank, "/payments", {"amount": amount, "to": to})


def find_payment(intent: exactcall.Intent) -> Any:
    """Reconcile probe: ask the bank for payments made under the call's key."""
    bank = intent.args["bank"]
    with urllib.request.urlopen(f"{bank}/payments?idempotency_key={intent.key}", timeout=10) as r:
        rows = json.loads(r.read())["payments"]
    if not rows:
        return exactcall.NotLanded()
    row = rows[0]
    return exactcall.Landed(
        {
            "payment_id": row["id"],
            "amount": row["amount"],
            "to": row["to_account"],
            "found_by": "probe",
        }
    )


async def cannot_tell(intent: exactcall.Intent) -> Any:
    return exactcall.Unknown("the ledger is down")


def _keyed_post(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Sends the key so the bank can be asked about it later (it does not dedupe for us)."""
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
def book(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _keyed_post(bank, amount, to)


@exactcall.tool(reconcile=cannot_tell, heartbeat_timeout=FAST)
def book_blind(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _keyed_post(bank, amount, to)


@exactcall.tool(heartbeat_timeout=FAST)
def book_no_probe(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _keyed_post(bank, amount, to)


@exactcall.tool(
    provider_idempotent=timedelta(seconds=1), reconcile=find_payment, heartbeat_timeout=FAST
)
def stripe_like(bank: str, amount: int, to: str) -> dict[str, Any]:
    """The provider keeps keys for 1 s only: past that, a re-call would be a new payment."""
    return _keyed_post(bank, amount, to)


@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
def book_then_explode(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Books the payment, then loses the answer: the probe must find it."""
    _keyed_post(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


@exactcall.tool(heartbeat_timeout=FAST)
def counted_send(channel: str, text: str) -> str:
    """Counts every real execution through the test kit's effect counter."""
    from exactcall.testing import record_effect

    record_effect(f"send:{channel}")
    return f"sent {text!r} to {channel}"


@exactcall.tool(
    heartbeat_timeout=FAST,
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3),
)
def lying_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then claims on its first attempt that nothing happened: crashtest must catch it."""
    receipt = post(bank, "/payments", {"amount": amount, "to": to})
    if exactcall.current_intent() and activity.info().attempt == 1:
        raise exactcall.NotExecuted("pretends the payment did not happen")
    return receipt


async def slow_probe(intent: exactcall.Intent) -> Any:
    await asyncio.sleep(30)  # far past the tool's reconcile_deadline
    return exactcall.NotLanded()


@exactcall.tool(
    reconcile=slow_probe, reconcile_deadline=timedelta(seconds=2), heartbeat_timeout=FAST
)
def book_slow_probe(bank: str, amount: int, to: str) -> dict[str, Any]:
    _keyed_post(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


@exactcall.tool(
    heartbeat_timeout=FAST,
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3),
)
async def refuse_late_then_pay(bank: str, amount: int, to: str, seconds: float) -> dict[str, Any]:
    """The first attempt says, after ``seconds``, that it did not pay; the next one pays."""
    if activity.info().attempt == 1:
        await asyncio.sleep(seconds)
        raise exactcall.NotExecuted("the bank was closed for the night")
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
def book_lost_once(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Loses the connection before sending, except when its reconciliation re-runs it: the
    probe finds nothing, the re-run books it (a reconciliation that re-runs a call)."""
    from exactcall.reconciliation._verdicts import reconcile_id

    if activity.info().workflow_id != reconcile_id(exactcall.idempotency_key()):
        raise ConnectionResetError("connection reset before the request was sent")
    return _keyed_post(bank, amount, to)
