"""`exactcall server` and `exactcall worker` as a person runs them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
from pathlib import Path

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from exactcall.embedded._server import free_port, port_open
from tests.conftest import ROOT


async def test_server_starts_says_where_and_stops_its_child_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "EXACTCALL_HOME": str(tmp_path)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "server",
        "--port",
        str(port),
        "--headless",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines = [(await asyncio.wait_for(proc.stdout.readline(), 30)).decode() for _ in range(3)]
    assert f"Temporal dev server on 127.0.0.1:{port}" in lines[0]
    assert str(tmp_path / "temporal.db") in lines[1]
    client = await Client.connect(f"127.0.0.1:{port}")
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    for _ in range(100):
        if not port_open("127.0.0.1", port):
            break
        await asyncio.sleep(0.1)
    assert not port_open("127.0.0.1", port), "the dev server outlived `exactcall server`"
    assert (tmp_path / "temporal.db").exists()
    # a file-backed server keeps a write-ahead log (fewer fsyncs per commit, as durable)
    with contextlib.closing(sqlite3.connect(tmp_path / "temporal.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_worker_usage_errors_exit_2() -> None:
    for args in (
        ["worker"],
        ["worker", "--task-queue", "q"],
        ["worker", "--task-queue", "q", "--tools", "no.such.module"],
        ["worker", "--task-queue", "q", "--tools", "tests.tools", "--plugin", "no-colon"],
        ["worker", "--task-queue", "q", "--tools", "tests.tools", "--plugin", "tests.tools:pay"],
        ["worker", "--task-queue", "q", "--tools", "tests.tools", "--plugin", "no.such:thing"],
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "exactcall",
            *args,
            "--address",
            "127.0.0.1:1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 2, (args, err)


async def test_worker_tuning_flags_start_a_worker(server: object) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "worker",
        "--task-queue",
        "tuned",
        "--tools",
        "tests.tools",
        "--workflows",
        "tests.workflows",
        "--max-cached-workflows",
        "50",
        "--workflow-task-pollers",
        "10",
        "--max-concurrent-activities",
        "20",
        "--address",
        server.address,  # type: ignore[attr-defined]
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "EXACTCALL_LOG_LEVEL": "INFO"},
    )
    assert proc.stderr is not None
    try:
        line = b""
        while b"worker.started" not in line:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, "worker exited before it started"
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful shutdown
        assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_the_demo_quickstart_and_crashtest_need_no_test_framework() -> None:
    import subprocess

    probe = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pytest', '_pytest', 'pytest_asyncio'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import exactcall.demo.run, exactcall.quickstart.run, exactcall.dev._crashtest\n"
        "from exactcall.cli._main import _parser\n"
        "_parser()\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
