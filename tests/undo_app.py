"""Tools with undos for tests/test_undo.py. A payment's undo pays the same amount back, to
``<account>:refund`` at the same real local bank, under the undo's own key (the bank dedupes
on it), so the tests count each undo's effect at the destination."""

from __future__ import annotations

from typing import Any

import exactcall
from exactcall.demo.bank_client import payments_with_key
from tests.tools import FAST, post


def _keyed(bank: str, amount: int, to: str, memo: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"amount": amount, "to": to, "memo": memo}
    return post(bank, "/payments", body, exactcall.idempotency_headers())


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def saga_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _keyed(bank, amount, to)


@saga_pay.undo(provider_idempotent=True, heartbeat_timeout=FAST)
def refund_saga_pay(done: exactcall.Done) -> dict[str, Any]:
    """Pays the amount back, naming the undone call."""
    args = done.args
    return _keyed(str(args["bank"]), int(args["amount"]), f"{args['to']}:refund", done.step)  # type: ignore[call-overload]


REFUSE_CANCEL: set[str] = set()
"""Accounts whose bookings the hotel refuses to cancel (a test adds one, then removes it)."""


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def saga_book(bank: str, amount: int, to: str) -> dict[str, Any]:
    return _keyed(bank, amount, to)


@saga_book.undo(name="cancel_booking", provider_idempotent=True, heartbeat_timeout=FAST)
def cancel_booking(done: exactcall.Done) -> dict[str, Any]:
    args = done.args
    if args["to"] in REFUSE_CANCEL:
        raise exactcall.NotExecuted("the hotel refuses to cancel a booking this late", retry=False)
    payment = done.result["payment_id"]  # type: ignore[index,call-overload]
    return _keyed(
        str(args["bank"]), int(args["amount"]), f"{args['to']}:refund", f"cancel {payment}"
    )  # type: ignore[call-overload]


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def saga_notify(bank: str, amount: int, to: str) -> dict[str, Any]:
    """No undo declared: a saga skips it and says so."""
    return _keyed(bank, amount, to)


def find_by_key(intent: exactcall.Intent) -> Any:
    """Probe: the bank's payments under the call's key."""
    rows = payments_with_key(str(intent.args["bank"]), intent.key)
    return exactcall.Landed({"payment_id": rows[0]["id"]}) if rows else exactcall.NotLanded()


def _pay_back(done: exactcall.Done) -> dict[str, Any]:
    args = done.args
    return _keyed(str(args["bank"]), int(args["amount"]), f"{args['to']}:refund", done.step)  # type: ignore[call-overload]


@exactcall.tool(
    provider_idempotent=False, heartbeat_timeout=FAST, on_unknown="raise", reconcile=find_by_key
)
def saga_lost(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then loses the answer: unknown, and the probe finds it landed."""
    _keyed(bank, amount, to)
    raise ConnectionResetError("connection reset after the request was sent")


@saga_lost.undo(provider_idempotent=True, heartbeat_timeout=FAST)
def undo_saga_lost(done: exactcall.Done) -> dict[str, Any]:
    return _pay_back(done)


_TRIED: set[str] = set()


@exactcall.tool(
    provider_idempotent=False, heartbeat_timeout=FAST, on_unknown="raise", reconcile=find_by_key
)
def saga_flaky(bank: str, amount: int, to: str) -> dict[str, Any]:
    """The first attempt under a key loses the connection before sending: unknown, the probe
    finds nothing, and the reconciliation's re-run pays."""
    key = exactcall.idempotency_key()
    if key not in _TRIED:
        _TRIED.add(key)
        raise ConnectionResetError("connection reset before the request was sent")
    return _keyed(bank, amount, to)


@saga_flaky.undo(provider_idempotent=True, heartbeat_timeout=FAST)
def undo_saga_flaky(done: exactcall.Done) -> dict[str, Any]:
    return _pay_back(done)


@exactcall.tool(
    provider_idempotent=False, heartbeat_timeout=FAST, on_unknown="raise", reconcile=find_by_key
)
def saga_declined(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Loses the connection before sending (unknown, the probe finds nothing), and the
    reconciliation's re-run is declined: it never happened."""
    key = exactcall.idempotency_key()
    if key not in _TRIED:
        _TRIED.add(key)
        raise ConnectionResetError("connection reset before the request was sent")
    raise exactcall.NotExecuted(f"card declined for {amount} to {to}", retry=False)


@saga_declined.undo(provider_idempotent=True, heartbeat_timeout=FAST)
def undo_saga_declined(done: exactcall.Done) -> dict[str, Any]:
    return _pay_back(done)


@exactcall.tool(provider_idempotent=False, heartbeat_timeout=FAST, reconcile=find_by_key)
def saga_charge(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A payment the bank does not dedupe (a crash after it is an unknown outcome); its
    probe finds it by the key."""
    return _keyed(bank, amount, to)


def find_refund(intent: exactcall.Intent) -> Any:
    """Probe of an undo: the bank's payments under the undo's own key."""
    done = intent.args["done"]
    rows = payments_with_key(str(done["args"]["bank"]), intent.key)
    return exactcall.Landed(rows[0]) if rows else exactcall.NotLanded()


@saga_charge.undo(provider_idempotent=False, heartbeat_timeout=FAST, reconcile=find_refund)
def refund_charge(done: exactcall.Done) -> dict[str, Any]:
    """Pays the amount back; a crash after it is an unknown outcome, which the probe
    settles."""
    return _pay_back(done)


@exactcall.tool(read_only=True, heartbeat_timeout=FAST)
def saga_look(bank: str, to: str) -> int:
    """A read: nothing to undo."""
    return 0
