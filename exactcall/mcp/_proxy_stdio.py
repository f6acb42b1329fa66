"""The proxy's stdio layer: raw newline-delimited JSON-RPC between an MCP client and a server.

The client is this process's stdin and stdout; the upstream server is a child process. Lines
are forwarded as the bytes they are (never re-encoded), so batches, lines that are not JSON
and fields this code does not know pass through untouched. Only two things are added to the
streams: the proxy's own answers to the client (for the write calls it takes over, and
progress notifications) and the proxy's own requests to the upstream (``tools/call`` of those
writes, ``tools/list``), whose ids start with :data:`MCP_PROXY_ID_PREFIX` and whose responses
are kept from the client.

Nothing but JSON-RPC is written to the client: :func:`claim_stdio` moves the real stdout to a
private descriptor and points fd 1 at stderr, so a stray ``print`` cannot corrupt the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import select
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from exactcall._wire import MCP_PROXY_ID_PREFIX

__all__ = [
    "MCP_PROXY_ID_PREFIX",
    "ClientSide",
    "ClientStdio",
    "Upstream",
    "UpstreamCancelled",
    "UpstreamError",
    "UpstreamGone",
    "UpstreamNotSent",
    "claim_stdio",
    "parse",
    "request_key",
]

ENVELOPE_PREFIX = "io.modelcontextprotocol/"
NOT_SENT_DATA = "io.exactcall/not-sent"
"""In the ``data`` of an error the proxy made up for a request it could not send at all."""
LINE_LIMIT = 64 * 1024 * 1024  # one JSON-RPC message per line; results can be large


class UpstreamGone(ConnectionError):
    """The upstream server's stdout closed (it exited or crashed)."""


class UpstreamNotSent(ConnectionError):
    """One of the proxy's requests could not be sent at all (an HTTP server that could not
    be connected to): it did not run."""


class UpstreamCancelled(Exception):
    """One of the proxy's requests was cancelled after it was sent, and the server did not
    answer within the grace: whether it ran is unknown."""


class UpstreamError(Exception):
    """The upstream answered one of the proxy's requests with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error
        self.code = error.get("code")
        super().__init__(f"JSON-RPC error {self.code}: {error.get('message')}")


def parse(line: bytes) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None for anything else (a batch, not JSON, empty)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def request_key(value: Any) -> str:
    """A JSON-RPC id as a dict key (1 and "1" stay apart)."""
    return json.dumps(value)


def encode(message: dict[str, Any]) -> bytes:
    """One JSON-RPC message as one line (json.dumps escapes newlines inside strings)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def claim_stdio() -> tuple[int, int]:
    """Take fds 0 and 1 for the client stream; leave /dev/null on 0 and stderr on 1.

    Returns private (non-inheritable) copies of the client's stdin and stdout, so child
    processes (the upstream gets its own pipes; the Temporal dev server) never hold them.
    """
    client_in, client_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return client_in, client_out


class ClientSide(Protocol):
    """Where a session's client is: lines from it, and lines to it (in order). ``written(ok)``
    is called once a line reached the client's transport (True) or could not (False)."""

    def lines(self) -> AsyncIterator[bytes]: ...

    def send_line(self, line: bytes, written: Callable[[bool], None] | None = None) -> None: ...

    def send(
        self, message: dict[str, Any], written: Callable[[bool], None] | None = None
    ) -> None: ...


class ClientStdio:
    """Lines from the client (a reader thread) and lines to it, in order: written at once
    from the event loop when nothing is queued and the pipe takes them (no thread handoff on
    an answer's path), else by a writer thread that waits for the pipe."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self._in = os.fdopen(in_fd, "rb")
        self._out_fd = out_fd
        os.set_blocking(out_fd, False)  # a private copy: only this proxy writes through it
        self._outbox: queue.SimpleQueue[tuple[bytes, Callable[[bool], None] | None] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._queued = 0
        """Lines queued for (or being written by) the writer thread: later lines follow."""
        self._broken = False
        self._writer = threading.Thread(target=self._write_loop, name="mcp-proxy-out", daemon=True)
        self._writer.start()

    def send_line(self, line: bytes, written: Callable[[bool], None] | None = None) -> None:
        """Send raw bytes to the client (a line as it came, newline included).
        ``written(ok)`` is called once the line was written to the client's pipe (True), or
        could not be (False: the client went away)."""
        with self._lock:
            if self._queued == 0:
                line = line[self._write_now(line) :]
            done = not line or self._broken
            if not done:
                self._queued += 1
                self._outbox.put((line, written))
        if done and written is not None:
            with contextlib.suppress(Exception):
                written(not self._broken)

    def _write_now(self, data: bytes) -> int:
        """How much of ``data`` the pipe took now, without waiting."""
        if self._broken:
            return 0
        try:
            return os.write(self._out_fd, data)
        except BlockingIOError:
            return 0
        except OSError:  # the client went away: nothing more can reach it
            self._broken = True
            return 0

    def send(self, message: dict[str, Any], written: Callable[[bool], None] | None = None) -> None:
        self.send_line(encode(message), written)

    def _write_loop(self) -> None:
        while (item := self._outbox.get()) is not None:
            data, written = item
            view = memoryview(data)
            while view and not self._broken:
                try:
                    view = view[os.write(self._out_fd, view) :]
                except BlockingIOError:  # the pipe is full: wait until the client reads
                    select.select([], [self._out_fd], [], 1.0)
                except OSError:  # the client went away: nothing more can reach it
                    self._broken = True
            with self._lock:
                self._queued -= 1
            if written is not None:
                with contextlib.suppress(Exception):
                    written(not self._broken)

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued (bounded), then stop the writer."""
        self._outbox.put(None)
        self._writer.join(timeout)

    async def lines(self) -> AsyncIterator[bytes]:
        """Each line from the client, until it closes its end."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[bytes] = asyncio.Queue()

        def read() -> None:
            with contextlib.suppress(RuntimeError, OSError, ValueError):  # the loop has closed
                for line in iter(self._in.readline, b""):
                    loop.call_soon_threadsafe(inbox.put_nowait, line)
                loop.call_soon_threadsafe(inbox.put_nowait, b"")

        threading.Thread(target=read, name="mcp-proxy-in", daemon=True).start()
        while line := await inbox.get():
            yield line


class Upstream:
    """The upstream MCP server: a child process on pipes, plus the proxy's own requests to it.

    ``envelope`` holds the ``io.modelcontextprotocol/*`` ``_meta`` entries of the client's
    latest request (the 2026-07-28 per-request envelope); ``ready`` is set once the client's
    session is usable (its ``initialize`` was answered, or an envelope was seen), so requests
    the proxy makes on its behalf are valid in either protocol era.
    """

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.proc: asyncio.subprocess.Process | None = None
        self.envelope: dict[str, Any] = {}
        self.negotiated: str | None = None
        """The protocol version the server answered ``initialize`` with (a session before
        2026-07-28), or None (the per-request envelope's era, or not known yet)."""
        self._initialize_ids: set[Any] = set()
        self.ready = asyncio.Event()
        self.gone = asyncio.Event()
        self._ids = itertools.count(1)
        self._prefix = f"{MCP_PROXY_ID_PREFIX}{uuid.uuid4().hex[:8]}-"
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
        )

    async def send_line(self, line: bytes) -> None:
        """Write raw bytes to the upstream's stdin (dropped once it is gone)."""
        proc = self.proc
        if proc is None or proc.stdin is None or self.gone.is_set():
            return
        async with self._lock:
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
            except (ConnectionError, OSError):
                pass

    def note_client_message(self, msg: dict[str, Any]) -> None:
        """Learn the session's era and envelope from a message the client sent."""
        if msg.get("method") == "initialize" and "id" in msg:
            self._initialize_ids.add(json.dumps(msg["id"]))
        params = msg.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict) and self.negotiated is None:
            envelope = {k: v for k, v in meta.items() if k.startswith(ENVELOPE_PREFIX)}
            if envelope:
                self.envelope = envelope
                self.ready.set()
        if msg.get("method") == "notifications/initialized":
            self.ready.set()

    def note_server_message(self, msg: dict[str, Any]) -> None:
        """Learn the negotiated version from the server's answer to the client's
        ``initialize``: such a session has no per-request envelope, so one left by the client's
        earlier probe (a failed ``server/discover``) is dropped, never stamped on calls."""
        if "method" in msg or "id" not in msg:
            return
        rid = json.dumps(msg["id"])
        if rid not in self._initialize_ids:
            return
        self._initialize_ids.discard(rid)
        result = msg.get("result")
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if isinstance(version, str):
            self.negotiated = version
            self.envelope = {}

    async def request(
        self, method: str, params: dict[str, Any], *, cancel_grace: float | None = None
    ) -> dict[str, Any]:
        """Send a request of the proxy's own and wait for its result (UpstreamError,
        UpstreamGone).

        With ``cancel_grace``, a cancellation of the caller once the request was sent is told
        to the server as MCP says (``notifications/cancelled`` with this request's id), and the
        answer is still awaited for up to that many seconds: the result if one comes (the
        call ran), else UpstreamCancelled (whether it ran is unknown)."""
        if self.gone.is_set():
            raise UpstreamGone("the upstream MCP server has exited")
        rid = f"{self._prefix}{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self.send_line(
                encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            )
            try:
                response = await (fut if cancel_grace is None else asyncio.shield(fut))
            except asyncio.CancelledError:
                if cancel_grace is None:
                    raise
                response = await self._after_cancel(rid, fut, cancel_grace)
        finally:
            self._pending.pop(rid, None)
        if "error" in response:
            err = response["error"]
            err = err if isinstance(err, dict) else {"message": str(err)}
            data = err.get("data")
            if isinstance(data, dict) and data.get(NOT_SENT_DATA) is True:
                raise UpstreamNotSent(str(err.get("message")))
            raise UpstreamError(err)
        result = response.get("result")
        return result if isinstance(result, dict) else {"value": result}

    async def _after_cancel(
        self, rid: str, fut: asyncio.Future[dict[str, Any]], grace: float
    ) -> dict[str, Any]:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the cancellation is handled here: the answer decides
        note = {"requestId": rid, "reason": "the client cancelled the request"}
        await self.send_line(
            encode({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": note})
        )
        try:
            return await asyncio.wait_for(asyncio.shield(fut), grace)
        except TimeoutError:
            raise UpstreamCancelled(
                f"cancelled after it was sent; the server did not answer within {grace:g}s, "
                "so whether it ran is unknown"
            ) from None

    def with_envelope(self, params: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        """``params`` with ``_meta`` = the session envelope, then ``meta``."""
        merged = {**self.envelope, **meta}
        return {**params, "_meta": merged} if merged else dict(params)

    async def _read(self) -> bytes:
        """The upstream's next line; b"" once it is gone."""
        assert self.proc is not None and self.proc.stdout is not None
        return await _readline(self.proc.stdout)

    @property
    def open(self) -> bool:
        """Started and not gone (calls can be sent to it)."""
        return self.proc is not None and not self.gone.is_set()

    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def failed(self) -> bool:
        """Whether it exited on its own with an error (the proxy then exits 1)."""
        return self.exit_code() not in (0, None)

    async def pump(self, forward: Callable[[bytes, dict[str, Any] | None], None]) -> None:
        """Read the upstream until it closes: answers to the proxy's own requests resolve
        them, every other line goes to ``forward`` (raw, with its parse)."""
        try:
            while line := await self._read():
                msg = parse(line)
                rid = msg.get("id") if msg is not None else None
                if isinstance(rid, str) and rid in self._pending and "method" not in (msg or {}):
                    fut = self._pending[rid]
                    if not fut.done():
                        fut.set_result(msg or {})
                    continue
                forward(line, msg)
        finally:
            self.gone.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(
                        UpstreamGone("the upstream MCP server exited during the call")
                    )

    async def stop(self, grace: float = 2.0) -> int | None:
        """Close its stdin (MCP servers exit on EOF), then terminate, then kill."""
        proc = self.proc
        if proc is None:
            return None
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        for step in (None, proc.terminate, proc.kill):
            if step is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    step()
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(proc.wait(), grace)
        return proc.returncode


async def _readline(stream: asyncio.StreamReader) -> bytes:
    """One line, however long (up to LINE_LIMIT); b"" at EOF."""
    try:
        return await stream.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except asyncio.LimitOverrunError:
        return await stream.read(LINE_LIMIT)
