"""The refund app after the deploy: both tools gained ``currency: str = "EUR"`` (see
tests/sig_v1.py, the app before it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import exactcall
from exactcall.quickstart._common import pay_at_bank

FAST = timedelta(seconds=2)


@exactcall.tool(name="sig_refund", provider_idempotent=True, heartbeat_timeout=FAST)
async def sig_refund(
    bank: str, order: str, amount: int, currency: str = "EUR", *, idempotency_key: str
) -> dict[str, Any]:
    """Refund ``amount`` of ``order`` (the bank books it once per key)."""
    return await pay_at_bank(bank, amount, order, key=idempotency_key)


@exactcall.tool(name="sig_approved_refund", approval=True, heartbeat_timeout=FAST)
async def sig_approved_refund(
    bank: str, order: str, amount: int, currency: str = "EUR", *, idempotency_key: str
) -> dict[str, Any]:
    """Refund, once a person approved exactly this call."""
    return await pay_at_bank(bank, amount, order, key=idempotency_key)
