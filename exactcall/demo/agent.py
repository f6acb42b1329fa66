"""The agent ``exactcall crashtest --demo`` runs: four kinds of side effect in one workflow.

Sandbox-safe: no side effects at import time.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo import tools  # noqa: F401  (registers the demo tools)

__all__ = ["SupportAgent"]


@workflow.defn
class SupportAgent:
    """Refunds a customer, pays a partner, makes an approved transfer, pays a contractor."""

    @workflow.run
    async def run(self, bank: str) -> list[dict[str, Any]]:
        plan = [
            ("pay", 10, "alice"),  # the bank dedupes on the key
            ("pay_probed", 20, "bob"),  # unknown outcomes settled by a probe
            ("approved_pay", 30, "carol"),  # waits for a person's approval of these args
            ("pay_no_key", 5, "dave"),  # no dedupe, no probe: unknown outcomes are parked
        ]
        out: list[dict[str, Any]] = []
        for tool, amount, to in plan:
            try:
                receipt = await exactcall.call(tool, bank, amount, to)
                out.append({"tool": tool, "status": "done", "payment_id": receipt["payment_id"]})
            except exactcall.ExactcallError as err:
                out.append({"tool": tool, "status": err.code, "reason": err.message})
        return out
