"""The refund app's tools before a deploy (tests/test_signature_change.py; the workflow is
tests/sig_workflow.py). ``tests/sig_v2.py`` holds them after the deploy: both gained
``currency: str = "EUR"``. Each version runs in its own worker process (a tool name has one
definition per process)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import exactcall
from exactcall.quickstart._common import pay_at_bank

FAST = timedelta(seconds=2)


@exactcall.tool(name="sig_refund", provider_idempotent=True, heartbeat_timeout=FAST)
async def sig_refund(bank: str, order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund ``amount`` of ``order`` (the bank books it once per key)."""
    return await pay_at_bank(bank, amount, order, key=idempotency_key)


@exactcall.tool(name="sig_approved_refund", approval=True, heartbeat_timeout=FAST)
async def sig_approved_refund(
    bank: str, order: str, amount: int, *, idempotency_key: str
) -> dict[str, Any]:
    """Refund, once a person approved exactly this call."""
    return await pay_at_bank(bank, amount, order, key=idempotency_key)
