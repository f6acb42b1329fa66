"""The client side of the proxy's tests: a proxy process started by the MCP SDK's real stdio
client, in front of ``tests.mcp_proxy_servers``, and what its server did (the effects file)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from temporalio.client import Client as TemporalClient

from exactcall.embedded._server import free_port, port_open
from exactcall.reconciliation import list_unresolved

ROOT = Path(__file__).resolve().parent.parent
DEDUP = "io.exactcall/deduplicated"
"""The wire names the proxy's answers carry in ``_meta`` (spelled out: the tests pin them)."""
OUTCOME = "io.exactcall/outcome"
READ_TIMEOUT = 60.0  # no request to a proxy takes this long: fail, do not hang


def fresh() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def proxy_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(PYTHONPATH=str(ROOT), EXACTCALL_HOME=str(home), PYTHONUNBUFFERED="1")
    return env


def proxy_args(
    name: str,
    audit: Path,
    flags: tuple[str, ...],
    address: str | None,
    kind: str,
    target: Path,
    url: str | None = None,
    command: str = "proxy",
) -> list[str]:
    """``python -m exactcall mcp proxy`` (or ``serve``) in front of ``tests.mcp_proxy_servers
    KIND TARGET``, or of the HTTP server at ``url``."""
    args = ["-m", "exactcall", "mcp", command, "--name", name, "--audit", str(audit), *flags]
    if address:
        args += ["--address", address]
    if url is not None:
        return [*args, "--url", url]
    return [*args, "--", sys.executable, "-m", "tests.mcp_proxy_servers", kind, str(target)]


@dataclass
class Proxied:
    client: Client
    effects: Path
    audit: Path
    name: str

    def count(self, tool: str, arg: str | None = None) -> int:
        lines = self.effects.read_text().splitlines() if self.effects.exists() else []
        return sum(
            1 for ln in lines if ln.split(" ")[0] == tool and arg in (None, ln.split(" ")[1])
        )

    def keys(self, tool: str) -> list[str]:
        return [
            ln.split(" ")[2] for ln in self.effects.read_text().splitlines() if ln.startswith(tool)
        ]

    def audit_rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()]

    def pids(self) -> tuple[int, int]:
        """(the upstream server's pid, the proxy's pid)."""
        up, parent = Path(f"{self.effects}.pid").read_text().split()
        return int(up), int(parent)


@contextlib.asynccontextmanager
async def proxied(
    tmp_path: Path,
    *flags: str,
    name: str,
    address: str | None,
    mode: str = "auto",
    effects: Path | None = None,
    home: Path | None = None,
    url: str | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Proxied]:
    """A real stdio client session with a proxy in front of the effects server (over stdio,
    or the one at ``url`` over Streamable HTTP: see :func:`http_effects`)."""
    effects = effects or tmp_path / f"{name}.effects"
    audit = tmp_path / f"{name}.audit.jsonl"
    params = StdioServerParameters(
        command=sys.executable,
        args=proxy_args(name, audit, flags, address, "effects", effects, url=url),
        env={**proxy_env(home or tmp_path), **(env or {})},
        cwd=ROOT,
    )
    log_path = tmp_path / f"{name}.log"
    try:
        with log_path.open("a") as log:
            transport = stdio_client(params, errlog=log)
            async with Client(transport, mode=mode, read_timeout_seconds=READ_TIMEOUT) as client:
                yield Proxied(client, effects, audit, name)
    except BaseException:  # show what the proxy said (its stderr) with the failure
        print(f"--- {log_path} (tail)\n" + log_path.read_text()[-4000:])
        raise


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on port {port}")
        time.sleep(0.05)


@contextlib.contextmanager
def http_effects(effects: Path, port: int | None = None) -> Any:
    """The effects server over Streamable HTTP (a real process): yields (url, process)."""
    port = port or free_port()
    with effects.with_suffix(".http.log").open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_proxy_servers", "effects", str(effects), str(port)],
            cwd=ROOT,
            env=proxy_env(effects.parent),
            stdout=log,
            stderr=log,
        )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait()


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def meta(result: Any) -> dict[str, Any]:
    return dict(result.meta or {})


async def eventually(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def spawn_raw(args: list[str], tmp_path: Path) -> subprocess.Popen[bytes]:
    with (tmp_path / "raw-proxy.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env=proxy_env(tmp_path),
        )


def read_lines(proc: subprocess.Popen[bytes], into: list[bytes]) -> None:
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        into.append(line)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


async def parked(client: TemporalClient, workflow_id: str) -> list[Any]:
    """The parked calls of a workflow, once visibility lists them."""
    deadline = time.monotonic() + 20
    while True:
        rows = [r for r in await list_unresolved(client) if r.workflow_id == workflow_id]
        if rows or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.2)
