"""A client of the demo bank (``exactcall.demo.bank``): book a payment, find payments by key.

Plain functions (blocking HTTP, stdlib only), shared by the demo's tools and the quickstart's.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["HTTP_TIMEOUT", "payments_with_key", "post_payment", "receipt_with_key"]

HTTP_TIMEOUT = 30.0


def post_payment(
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


def payments_with_key(bank: str, key: str) -> list[dict[str, Any]]:
    """``GET {bank}/payments?idempotency_key=K``: the payments the bank booked under ``key``."""
    query = urllib.parse.urlencode({"idempotency_key": key})
    with urllib.request.urlopen(f"{bank.rstrip('/')}/payments?{query}", timeout=HTTP_TIMEOUT) as r:
        rows: list[dict[str, Any]] = json.loads(r.read())["payments"]
    return rows


def receipt_with_key(bank: str, key: str) -> dict[str, Any] | None:
    """The receipt of the payment the bank booked under ``key`` (the shape ``POST /payments``
    answers), or None: what a reconciliation probe returns as ``Landed``."""
    rows = payments_with_key(bank, key)
    if not rows:
        return None
    row = rows[0]
    return {
        "payment_id": row["id"],
        "amount": row["amount"],
        "to": row["to_account"],
        "idempotency_key": row["idempotency_key"],
        "status": "succeeded",
    }
