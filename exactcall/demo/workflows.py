"""The demo's agents: payments through exactcall, and the same payment without it.

Sandbox-safe: nothing happens at import time; exactcall and the tools module are passed
through the workflow sandbox (importing the tools registers them, so a worker that serves
only these workflows still knows the tools by name).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo import tools as _tools  # noqa: F401 (registers the demo's tools)

__all__ = ["ApprovalAgent", "BarePaymentAgent", "PaymentAgent"]


@workflow.defn
class PaymentAgent:
    """Pays through an exactcall tool (``pay``, ``pay_probed``, ``pay_no_key``) and reports
    the outcome. ``on_unknown``: ``"wait"`` for the reconciliation's verdict when the outcome
    is unknown, ``"raise"`` to report it at once (None: the tool's default, ``"wait"``)."""

    @workflow.run
    async def run(
        self,
        bank: str,
        amount: int,
        to: str,
        tool: str,
        on_unknown: Literal["wait", "raise"] | None = None,
    ) -> dict[str, Any]:
        try:
            receipt = await exactcall.call(tool, bank, amount, to, on_unknown=on_unknown)
        except exactcall.AmbiguousOutcome as err:
            return {"status": "unknown", "reason": err.message}
        except exactcall.CallAbandoned as err:
            return {"status": "abandoned", "reason": err.message}
        return {"status": "done", "receipt": receipt}


@workflow.defn
class ApprovalAgent:
    """Pays ``amount`` to ``to`` through ``approved_pay`` (a person approves it), then "changes
    its mind" and asks to pay ``changed_amount`` to ``changed_to``: a new call, which needs an
    approval of its own."""

    @workflow.run
    async def run(
        self, bank: str, amount: int, to: str, changed_amount: int, changed_to: str
    ) -> dict[str, Any]:
        try:
            first = await exactcall.call("approved_pay", bank, amount, to)
        except exactcall.ApprovalDenied as err:
            return {"status": "denied", "reason": err.message, "paid": []}
        try:
            second = await exactcall.call("approved_pay", bank, changed_amount, changed_to)
        except exactcall.ApprovalDenied as err:
            return {"status": "denied", "reason": err.message, "paid": [first]}
        return {"status": "done", "paid": [first, second]}


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
