"""App B: its own ``scoped_refund`` tool and its ``ScopedRefunder`` workflow."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall


@exactcall.tool(name="scoped_refund")
def scoped_refund(order: str, *, idempotency_key: str) -> dict[str, Any]:
    """Refund ``order`` (app B's provider)."""
    return {"app": "b", "order": order, "key": idempotency_key}


@workflow.defn(name="ScopedRefunder")
class ScopedRefunder:
    @workflow.run
    async def run(self, order: str) -> Any:
        return await exactcall.call("scoped_refund", order)  # by name: the worker's own tool
