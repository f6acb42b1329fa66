"""Faults for tests: a TCP proxy that can cut a worker off from the Temporal frontend.

``FaultProxy(upstream)`` listens on a local port and forwards each connection to
``upstream`` (``host:port``), in a thread of its own, so it keeps forwarding while the test's
event loop waits. A worker started with the proxy's ``address`` reaches the server only
through it. Modes (``proxy.mode = ...``, any time):

- ``"pass"``: forward as is;
- ``"delay"``: forward each chunk ``delay`` seconds late;
- ``"blackhole"``: forward nothing, in either direction, and accept new connections without
  forwarding them: the bytes wait in the kernel's buffers as in a real partition (TCP
  retransmits), and flow again when the mode goes back to ``"pass"`` (heal);
- ``"drop"``: close every connection and refuse new ones at once (the peer sees a reset).

Freezing a worker (SIGSTOP of its process group) is ``WorkerProcess.freeze()``/``thaw()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Literal

__all__ = ["FaultProxy", "Mode"]

Mode = Literal["pass", "delay", "blackhole", "drop"]


class FaultProxy:
    """A TCP proxy between one client (a worker) and ``upstream``, whose links can fail."""

    __test__ = False

    def __init__(self, upstream: str, *, delay: float = 0.5) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host or "127.0.0.1", int(port))
        self.delay = delay
        self._mode: Mode = "pass"
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.connections = 0
        """Connections accepted so far (a reconnect after a drop counts again)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="exactcall-fault-proxy", daemon=True
        )
        self._thread.start()
        ready.wait(10)
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._loop.call_soon_threadsafe(self._set_mode, mode)

    def _set_mode(self, mode: Mode) -> None:
        self._mode = mode
        assert self._open is not None
        if mode == "blackhole":
            self._open.clear()
        else:
            self._open.set()
        if mode == "drop":
            for w in list(self._writers):
                w.transport.abort()

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the proxy's own thread ---------------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._open = asyncio.Event()
            self._open.set()
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

        self._loop.run_until_complete(start())
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._mode == "drop":
            writer.transport.abort()
            return
        self._writers.add(writer)
        assert self._open is not None
        try:
            await self._open.wait()  # a partition holds a new connection too
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while True:
                await self._open.wait()  # blackholed: read nothing, the bytes wait
                data = await src.read(65536)
                if not data:
                    break
                if self._mode == "delay":
                    await asyncio.sleep(self.delay)
                await self._open.wait()  # (a partition that began while this was read)
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()
