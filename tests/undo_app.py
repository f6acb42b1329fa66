"""Tools with undos for tests/test_undo.py. A payment's undo pays the same amount back, to
``<account>:refund`` at the same real local bank, under the undo's own key (the bank dedupes
on it), so the tests count each undo's effect at the destination."""

from __future__ import annotations

from typing import Any

import exactcall
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
