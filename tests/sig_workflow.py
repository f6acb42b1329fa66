"""The workflow of the refund app, before and after its deploy (tests/sig_v1.py, sig_v2.py):
it calls the tools by name, so either version's worker runs it."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall


@workflow.defn(name="SigRefund")
class SigRefund:
    @workflow.run
    async def run(self, req: dict[str, Any]) -> Any:
        tool = "sig_approved_refund" if req.get("approved") else "sig_refund"
        try:
            return await exactcall.call(tool, **req["args"])
        except exactcall.ExactcallError as err:
            return {"error": err.code, "message": err.message}
