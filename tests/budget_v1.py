"""A tool before its deploy gained ``budgets=`` (tests/budget_app.py holds it after). Each
version runs in its own process: a tool name has one definition per process.

    python -m tests.budget_v1     # records tests/histories/budget/before_budgets.json
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import exactcall
from tests.tools import FAST, post


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
def budget_late(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


async def _record() -> None:
    from exactcall._worker import Connection, connect
    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer
    from tests.conftest import plan, running_worker, start_agent, step
    from tests.make_histories import without_stack_traces

    out = Path(__file__).parent / "histories" / "budget" / "before_budgets.json"
    with DevServer(fast=True) as server, Bank(Path(tempfile.mkdtemp()) / "bank.db") as bank:
        client = await connect(Connection(address=server.address))
        async with running_worker(client, "budget-v1"):
            h = await start_agent(
                client, "budget-v1", plan(step("budget_late", bank.url, 40, "acct-v1")), "before"
            )
            await h.result()
        history = await h.fetch_history()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(without_stack_traces(history.to_json_dict()), indent=1) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    asyncio.run(_record())
