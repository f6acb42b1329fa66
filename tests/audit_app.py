"""Tools for the audit and recorded-tools tests (imported by them, so registered in-process)."""

from __future__ import annotations

from typing import Any

import exactcall
from tests.tools import FAST, post


@exactcall.tool(heartbeat_timeout=FAST)
def declined_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """A card that is declined before anything is sent: a definite failure."""
    raise exactcall.NotExecuted(f"card declined for {amount} to {to}", retry=False)


@exactcall.tool(heartbeat_timeout=FAST)
def explode_after_paying(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pays, then loses the answer: the outcome is unknown (no probe: a person decides)."""
    post(bank, "/payments", {"amount": amount, "to": to})
    raise RuntimeError("connection reset after the request was sent")
