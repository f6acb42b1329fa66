"""``exactcall mcp serve --port P -- COMMAND`` (or ``--url URL``): the proxy for HTTP clients.

A Streamable HTTP MCP endpoint (``http://127.0.0.1:P/mcp``) in front of a server: each client
session (an ``initialize`` without ``Mcp-Session-Id``) gets its own upstream session (a child
process running COMMAND, or a session with the HTTP server at URL) and the proxy's guarantees
(:mod:`exactcall.mcp.proxy`); every session shares this process's Temporal client and worker,
so an identical write from two sessions runs once.

The HTTP side: a ``POST`` of a request is answered with a server-sent event stream that ends
with its response; a ``POST`` of a notification or response gets ``202``; ``GET`` opens the
session's stream for what the server sends on its own (until one is open, that goes to the
newest open request stream, or waits); ``DELETE`` ends the session. A write's answer counts as
delivered only once it was written to its stream while the client was connected: an answer
whose client went away first is kept for the retry, as with stdio. A 2026-07-28 request (no
session: the protocol version is in its ``_meta``) goes to one session all such requests share,
with their ids made unique; closing its stream before the answer cancels it, as that protocol
says. Requests whose ``Origin``
is not local are refused (a web page cannot drive the proxy through the user's browser) unless
given with ``--allow-origin``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import structlog
import uvicorn

from exactcall.mcp._proxy_stdio import encode, parse, request_key
from exactcall.mcp.proxy import DRAIN_TIMEOUT, Proxy, Session, make_upstream

__all__ = ["HttpServe"]

log = structlog.get_logger("exactcall")
BODY_LIMIT = 64 * 1024 * 1024
BACKLOG = 1000
"""Messages the server sent on its own, kept while no stream of the session is open."""
SESSION_HEADER = b"mcp-session-id"
VERSION_META = "io.modelcontextprotocol/protocolVersion"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}

Written = Callable[[bool], None] | None


class HttpClient:
    """One HTTP client session, as the proxy's :class:`~._proxy_stdio.ClientSide`."""

    def __init__(self, session_id: str, stateless: bool = False) -> None:
        self.session_id = session_id
        self.stateless = stateless
        """The 2026-07-28 wire: no session; every client's requests share this one, so their
        ids are made unique on the way in and given back on the way out."""
        self._ids: dict[str, Any] = {}
        self._count = 0
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._posts: dict[str, asyncio.Queue[tuple[bytes, Written, bool]]] = {}
        self._tokens: dict[str, str] = {}
        self._get: asyncio.Queue[tuple[bytes, Written, bool]] | None = None
        self._backlog: list[tuple[bytes, Written, bool]] = []
        self.ended = asyncio.Event()
        self.streams = 0
        """Its streams open now (a POST waiting for its answer, the GET stream)."""
        self.seen = time.monotonic()
        """When its client last sent anything or had a stream open."""

    def touch(self) -> None:
        self.seen = time.monotonic()

    async def lines(self) -> AsyncIterator[bytes]:
        while line := await self._inbox.get():
            yield line

    def feed(self, line: bytes, msg: dict[str, Any]) -> tuple[asyncio.Queue[Any] | None, str]:
        """A message the client POSTed; for a request, the queue its stream reads (and the
        request's id as the session knows it)."""
        queue: asyncio.Queue[Any] | None = None
        rid = ""
        if "method" in msg and "id" in msg and self.stateless:
            self._count += 1
            unique = f"{self.session_id}-{self._count}"
            self._ids[request_key(unique)] = msg["id"]
            msg = {**msg, "id": unique}
            line = encode(msg)
        if "method" in msg and "id" in msg:
            rid = request_key(msg["id"])
            queue = self._posts[rid] = asyncio.Queue()
            params = msg.get("params")
            meta = params.get("_meta") if isinstance(params, dict) else None
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            if token is not None:
                self._tokens[request_key(token)] = rid
        self._inbox.put_nowait(line if line.endswith(b"\n") else line + b"\n")
        return queue, rid

    def cancel(self, rid: str) -> None:
        """The 2026-07-28 wire's cancel: the client closed the request's stream first."""
        params = {"requestId": json.loads(rid), "reason": "the client closed the stream"}
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        self._inbox.put_nowait(encode(note))

    def closed_post(self, rid: str) -> None:
        queue = self._posts.pop(rid, None)
        self._ids.pop(rid, None)
        self._tokens = {t: r for t, r in self._tokens.items() if r != rid}
        while queue is not None and not queue.empty():
            _, written, _ = queue.get_nowait()
            _tell(written, False)

    def open_get(self) -> asyncio.Queue[tuple[bytes, Written, bool]]:
        old, self._get = self._get, asyncio.Queue()
        if old is not None:
            old.put_nowait((b"", None, True))  # one GET stream at a time: the new one wins
        for item in self._backlog:
            self._get.put_nowait(item)
        self._backlog.clear()
        return self._get

    def closed_get(self, queue: asyncio.Queue[Any]) -> None:
        if self._get is queue:
            self._get = None

    def end(self) -> None:
        """The client ended the session (DELETE), or the server went away."""
        self.ended.set()
        self._inbox.put_nowait(b"")
        for rid in list(self._posts):
            self.closed_post(rid)
        if self._get is not None:
            self._get.put_nowait((b"", None, True))

    def send_line(self, line: bytes, written: Written = None) -> None:
        msg = parse(line)
        if msg is not None and "method" not in msg and "id" in msg:  # an answer: its stream
            rid = request_key(msg["id"])
            queue = self._posts.get(rid)
            if queue is None:
                _tell(written, False)  # its client went away: not delivered
            else:
                if rid in self._ids:  # the id its client gave
                    line = encode({**msg, "id": self._ids[rid]})
                queue.put_nowait((line, written, True))
            return
        target = None
        if msg is not None and msg.get("method") == "notifications/progress":
            params = msg.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            target = self._posts.get(self._tokens.get(request_key(token), ""))
        if target is None:
            target = self._get or next(reversed(self._posts.values()), None)
        if target is not None:
            target.put_nowait((line, written, False))
        elif len(self._backlog) < BACKLOG:
            self._backlog.append((line, written, False))
        else:
            _tell(written, False)

    def send(self, message: dict[str, Any], written: Written = None) -> None:
        self.send_line(encode(message), written)


class HttpServe:
    """The ASGI app and its sessions (one :class:`Session` each, on one :class:`Proxy`)."""

    def __init__(
        self,
        proxy: Proxy,
        ns: argparse.Namespace,
        path: str = "/mcp",
        allow_origins: tuple[str, ...] = (),
    ) -> None:
        self.proxy = proxy
        self.ns = ns
        self.path = path
        self.allow_origins = set(allow_origins)
        self.sessions: dict[str, tuple[Session, HttpClient, asyncio.Task[None]]] = {}
        self.closing = False
        self._stateless_sid: str | None = None
        self._stateless_lock = asyncio.Lock()

    # -- sessions ---------------------------------------------------------------------------
    async def reap(self, idle: float) -> None:
        """End sessions whose client is gone without saying so (no request, no open stream,
        no call in flight for ``idle`` seconds): their servers stop; the client, if it comes
        back, gets 404 and opens a new session, as MCP says."""
        while True:
            await asyncio.sleep(min(max(idle / 4, 0.2), 30.0))
            now = time.monotonic()
            for sid, (session, client, _) in list(self.sessions.items()):
                if client.streams or session.busy or now - client.seen < idle:
                    continue
                log.info(
                    "mcp_serve.session_idle", session=sid, idle_seconds=round(now - client.seen)
                )
                client.end()

    async def _open(self, stateless: bool = False) -> tuple[HttpClient, str | None]:
        sid = uuid.uuid4().hex
        upstream = make_upstream(self.ns)
        try:
            await upstream.start()
        except OSError as exc:
            return HttpClient(sid), f"cannot start {upstream.command[0]!r}: {exc}"
        client = HttpClient(sid, stateless)
        session = Session(self.proxy, client, upstream)
        task = asyncio.create_task(self._run(sid, session, client))
        self.sessions[sid] = (session, client, task)
        log.info("mcp_serve.session_opened", session=sid)
        return client, None

    async def _run(self, sid: str, session: Session, client: HttpClient) -> None:
        try:
            await session.run()
        finally:
            client.end()
            await session.close()
            self.sessions.pop(sid, None)
            log.info("mcp_serve.session_closed", session=sid)

    async def close(self) -> None:
        """End every session (its calls in flight finish and are answered, bounded)."""
        self.closing = True
        for _, client, _ in list(self.sessions.values()):
            client.end()
        tasks = [t for _, _, t in self.sessions.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT + 5)

    # -- ASGI -------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if scope.get("path", "").rstrip("/") != self.path.rstrip("/"):
            await _plain(send, 404, f"not found: the MCP endpoint is {self.path}")
            return
        origin = headers.get(b"origin", b"").decode("latin-1")
        if origin and not self._origin_allowed(origin):
            await _plain(send, 403, f"origin {origin!r} not allowed (see --allow-origin)")
            return
        method = scope.get("method")
        sid = headers.get(SESSION_HEADER, b"").decode("latin-1") or None
        if method == "POST":
            await self._post(receive, send, sid)
        elif method == "GET":
            await self._get(receive, send, sid)
        elif method == "DELETE":
            entry = self.sessions.get(sid or "")
            if entry is None:
                await _error(send, 404, None, -32600, "no such session")
                return
            entry[1].end()
            await _plain(send, 200, "session ended")
        else:
            await _plain(send, 405, "use POST, GET or DELETE", allow=b"GET, POST, DELETE")

    def _origin_allowed(self, origin: str) -> bool:
        if origin in self.allow_origins or "*" in self.allow_origins:
            return True
        host = urlsplit(origin).hostname
        return host is not None and host in LOCAL_HOSTS

    async def _post(self, receive: Any, send: Any, sid: str | None) -> None:
        body = await _body(receive)
        if body is None:
            await _error(send, 413, None, -32600, f"the body is over {BODY_LIMIT} bytes")
            return
        msg = parse(body)
        if msg is None:
            await _error(send, 400, None, -32700, "the body is not one JSON-RPC message")
            return
        if self.closing:
            await _error(send, 503, msg.get("id"), -32000, "the proxy is shutting down")
            return
        if sid is None and msg.get("method") != "initialize" and _enveloped(msg):
            client, failed = await self._stateless()
            if failed is not None:
                await _error(send, 502, msg.get("id"), -32603, f"exactcall proxy: {failed}")
                return
        elif sid is None:
            if msg.get("method") != "initialize":
                text = "no Mcp-Session-Id: send initialize first to open a session"
                await _error(send, 400, msg.get("id"), -32600, text)
                return
            client, failed = await self._open()
            if failed is not None:
                await _error(send, 502, msg.get("id"), -32603, f"exactcall proxy: {failed}")
                return
        else:
            entry = self.sessions.get(sid)
            if entry is None or entry[1].ended.is_set():
                text = "no such session (it ended, or the proxy restarted): initialize again"
                await _error(send, 404, msg.get("id"), -32600, text)
                return
            client = entry[1]
        raw = body.strip()  # forwarded as it came, unless it spans lines
        client.touch()
        queue, rid = client.feed(raw if b"\n" not in raw else encode(msg), msg)
        if queue is None:
            await send({"type": "http.response.start", "status": 202, "headers": _sid(client)})
            await send({"type": "http.response.body", "body": b""})
            return
        answered = False
        client.streams += 1
        try:
            answered = await _stream(send, receive, queue, client)
        finally:
            client.streams -= 1
            client.touch()
            client.closed_post(rid)
            if not answered and client.stateless and not client.ended.is_set():
                client.cancel(rid)

    async def _stateless(self) -> tuple[HttpClient, str | None]:
        """The session every 2026-07-28 request without a session shares (one upstream)."""
        async with self._stateless_lock:
            entry = self.sessions.get(self._stateless_sid or "")
            if entry is not None and not entry[1].ended.is_set():
                return entry[1], None
            client, failed = await self._open(stateless=True)
            self._stateless_sid = client.session_id if failed is None else None
            return client, failed

    async def _get(self, receive: Any, send: Any, sid: str | None) -> None:
        entry = self.sessions.get(sid or "")
        if entry is None:
            await _error(send, 404 if sid else 400, None, -32600, "no such session")
            return
        client = entry[1]
        queue = client.open_get()
        client.streams += 1
        try:
            await _stream(send, receive, queue, client)
        finally:
            client.streams -= 1
            client.touch()
            client.closed_get(queue)


async def _stream(send: Any, receive: Any, queue: asyncio.Queue[Any], client: HttpClient) -> bool:
    """Server-sent events from ``queue`` until a final one (True once it was written to a
    connected client), the client leaves, or the session ends; each item's ``written(ok)``
    says whether its client was still there."""
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers + _sid(client)})
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch())
    leaving = asyncio.ensure_future(gone.wait())
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, leaving}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                return False
            line, written, final = getter.result()
            if not line:  # the session ended, or a newer GET stream took over
                return False
            event = b"event: message\ndata: " + line.rstrip(b"\r\n") + b"\n\n"
            try:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                ok = not gone.is_set()
            except Exception:
                ok = False
            _tell(written, ok)
            if final or not ok:
                return final and ok
    finally:
        watcher.cancel()
        leaving.cancel()
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _tell(written: Written, ok: bool) -> None:
    if written is not None:
        with contextlib.suppress(Exception):
            written(ok)


def _sid(client: HttpClient) -> list[tuple[bytes, bytes]]:
    return [] if client.stateless else [(SESSION_HEADER, client.session_id.encode())]


def _enveloped(msg: dict[str, Any]) -> bool:
    """A 2026-07-28 request: its ``_meta`` carries the per-request protocol version."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and VERSION_META in meta


async def _body(receive: Any) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > BODY_LIMIT:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _plain(send: Any, status: int, text: str, allow: bytes | None = None) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if allow is not None:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode() + b"\n"})


async def _error(send: Any, status: int, rid: Any, code: int, text: str) -> None:
    body = encode({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": text}})
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handling: the proxy's own handlers end the sessions first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(proxy: Proxy, ns: argparse.Namespace) -> int:
    """Run the endpoint until SIGTERM or SIGINT (0), or say why it cannot listen (2)."""
    try:
        sock = socket.create_server((ns.host, ns.port), reuse_port=False)
    except OSError as exc:
        print(f"exactcall mcp serve: cannot listen on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    app = HttpServe(proxy, ns, path=ns.path, allow_origins=tuple(ns.allow_origin))
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5, access_log=False
    )
    server = _Uvicorn(config)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    proxy.start()
    running = asyncio.create_task(server.serve(sockets=[sock]))
    reaper = asyncio.create_task(app.reap(ns.session_idle.total_seconds()))
    host = f"[{ns.host}]" if ":" in ns.host else ns.host
    print(f"exactcall mcp serve: http://{host}:{port}{ns.path} ({proxy.name})", file=sys.stderr)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
    reaper.cancel()
    await app.close()
    server.should_exit = True
    with contextlib.suppress(Exception):
        await running
    stopped.cancel()
    await proxy.stop()
    return 0
