"""The demo's agents: one payment through exactcall, and the same payment without it.

Sandbox-safe: nothing happens at import time; exactcall and the tools module are passed
through the workflow sandbox (importing the tools registers them, so a worker that serves
only these workflows still knows the tools by name).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo import tools as _tools  # noqa: F401 (registers the demo's tools)

__all__ = ["BarePaymentAgent", "PaymentAgent"]


@workflow.defn
class PaymentAgent:
    """Pays through an exactcall tool (``pay`` or ``pay_no_key``) and reports the outcome."""

    @workflow.run
    async def run(self, bank: str, amount: int, to: str, tool: str) -> dict[str, Any]:
        try:
            receipt = await exactcall.call(tool, bank, amount, to)
        except exactcall.AmbiguousOutcome as err:
            return {"status": "unknown", "reason": err.message}
        return {"status": "done", "receipt": receipt}


@workflow.defn
class BarePaymentAgent:
    """The same payment as a plain Temporal activity with a retry policy, no exactcall."""

    @workflow.run
    async def run(self, bank: str, amount: int, to: str) -> dict[str, Any]:
        receipt = await workflow.execute_activity(
            "bare_pay",
            args=[bank, amount, to],
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=2),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)),
            result_type=dict,
        )
        return {"status": "done", "receipt": receipt}
