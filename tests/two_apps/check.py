"""Run by tests/test_tool_scope.py in a process of its own: two apps, one tool name."""

from __future__ import annotations

import asyncio
import sys
import uuid

import exactcall
from exactcall._tool import get_tool
from exactcall._worker import Connection, build_worker, connect
from exactcall.embedded._server import DevServer
from tests.two_apps import app_a, app_b


async def main(address: str) -> None:
    # each app's client lists its tools: a name means that worker's tool
    a = await connect(Connection(address=address), exactcall.Plugin(tools=[app_a.scoped_refund]))
    b = await connect(Connection(address=address), exactcall.Plugin(tools=[app_b.scoped_refund]))
    tq_a, tq_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    async with (
        build_worker(a, tq_a, [app_a.ScopedRefunder]),
        build_worker(b, tq_b, [app_b.ScopedRefunder]),
    ):
        got_a = await a.execute_workflow(
            "ScopedRefunder", "o1", id=f"a-{uuid.uuid4()}", task_queue=tq_a
        )
        got_b = await b.execute_workflow(
            "ScopedRefunder", "o1", id=f"b-{uuid.uuid4()}", task_queue=tq_b
        )
    assert got_a["app"] == "a" and got_b["app"] == "b", (got_a, got_b)
    print("CHECK scoped: ok")

    # without a list, a name alone is ambiguous, and Plugin() refuses to build a worker
    try:
        get_tool("scoped_refund")
    except exactcall.UnknownTool as err:
        assert "two exactcall tools are named 'scoped_refund'" in err.message, err.message
        print("CHECK ambiguous name: refused")
    everything = await connect(Connection(address=address), exactcall.Plugin())
    try:
        build_worker(everything, "x", [app_a.ScopedRefunder])
    except exactcall.ExactcallError as err:
        assert "Plugin(tools=[...])" in err.message, err.message
        print("CHECK Plugin() with both: refused")
    try:
        exactcall.Plugin(tools=[app_a.scoped_refund, app_b.scoped_refund])
    except ValueError as err:
        assert "two tools of one name" in str(err), err
        print("CHECK one list with both: refused")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with DevServer(fast=True) as server:
            asyncio.run(main(server.address))
