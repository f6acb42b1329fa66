"""The proxy's Streamable HTTP upstream: ``exactcall mcp proxy --url URL [--header K=V]``.

An :class:`~exactcall.mcp._proxy_stdio.Upstream` whose server is an MCP endpoint over HTTP
instead of a child process: each message the session sends is one ``POST`` (a request's answer
comes back as JSON or as a server-sent event stream, with whatever the server sends before
it); what the server sends on its own comes on a ``GET`` stream opened after the handshake;
the session id (``Mcp-Session-Id``) and the negotiated ``MCP-Protocol-Version`` go on every
request; closing the proxy ends the session (``DELETE``). The client side sees the same lines
it would see from a stdio server.

What a write's HTTP outcome means, for the once-only guarantee: a server that could not be
connected to, or that answered ``4xx`` (it refused or did not know the session), did not run
the call, so the call "did not happen" and can be sent again. Anything after the request
was sent (``5xx``, a stream that broke before the answer, a timeout) is unknown, and is never
re-sent: it goes to reconciliation, as with a stdio server that died mid-call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from typing import Any

import httpx2
import structlog

from exactcall.mcp._proxy_stdio import MCP_PROXY_ID_PREFIX, NOT_SENT_DATA, Upstream, encode, parse

__all__ = ["HttpUpstream"]

log = structlog.get_logger("exactcall")
logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per request, URLs included
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
VERSION_META = "io.modelcontextprotocol/protocolVersion"
TIMEOUT = httpx2.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
"""No read timeout: a tool may take long, and its activity's heartbeat says it is alive."""
GET_RETRIES = 5
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
"""Methods whose ``Mcp-Name`` header mirrors this parameter (2026-07-28)."""
_SAFE = re.compile(r"^[\x20-\x7E]*$")
_SENTINEL = re.compile(r"^=\?base64\?.*\?=$")


def header_value(value: str) -> str:
    """A header value as MCP carries it: printable ASCII as is, anything else base64 in the
    ``=?base64?...?=`` sentinel."""
    if _SAFE.fullmatch(value) and value == value.strip() and not _SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


class HttpUpstream(Upstream):
    """One MCP session with a Streamable HTTP server (see the module's docstring)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        super().__init__([url])
        self.url = url
        self.headers = dict(headers or {})
        self.session_id: str | None = None
        self._http: httpx2.AsyncClient | None = None
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._get: asyncio.Task[None] | None = None
        self._version: str | None = None
        self._stopped = False
        self._order = asyncio.Lock()
        self._init: dict[str, Any] | None = None
        """The client's ``initialize`` params (to open a new session when one expires)."""
        self._renewing = asyncio.Lock()
        self._renewals = 0

    async def start(self) -> None:
        self._http = httpx2.AsyncClient(headers=self.headers, timeout=TIMEOUT)

    @property
    def open(self) -> bool:
        return self._http is not None and not self._stopped and not self.gone.is_set()

    def exit_code(self) -> int | None:
        return None

    def failed(self) -> bool:
        return False

    async def _read(self) -> bytes:
        return await self._inbox.get()

    def _deliver(self, message: dict[str, Any] | bytes) -> None:
        line = message if isinstance(message, bytes) else encode(message)
        if not self._stopped:
            self._inbox.put_nowait(line)

    def _request_headers(self, msg: dict[str, Any] | None) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream"}
        headers["content-type"] = "application/json"
        if self.session_id:
            headers[SESSION_HEADER] = self.session_id
        params = msg.get("params") if msg else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(VERSION_META) if isinstance(meta, dict) else None
        version = version if isinstance(version, str) else (self.negotiated or self._version)
        if isinstance(version, str) and not (msg and msg.get("method") == "initialize"):
            headers[VERSION_HEADER] = version
            self._version = version
        method = msg.get("method") if msg else None
        if isinstance(method, str) and isinstance(meta, dict) and VERSION_META in meta:
            # the 2026-07-28 wire: routing headers that mirror the body (checked by servers)
            headers["mcp-method"] = method
            name = params.get(NAMED.get(method, "")) if isinstance(params, dict) else None
            if isinstance(name, str):
                headers["mcp-name"] = header_value(name)
        return headers

    async def send_line(self, line: bytes) -> None:
        """POST one message: a request in the background (its answer comes through
        :meth:`pump`), anything else in order."""
        if self._stopped or self._http is None:
            return
        msg = parse(line)
        if msg is not None and msg.get("method") == "initialize":
            self._init = msg.get("params") if isinstance(msg.get("params"), dict) else None
        if msg is not None and "method" in msg and "id" in msg:
            task = asyncio.create_task(self._post(line.strip(), msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        async with self._order:
            await self._post(line.strip(), msg)

    async def _post(self, body: bytes, msg: dict[str, Any] | None, renewed: bool = False) -> None:
        assert self._http is not None
        rid = msg.get("id") if msg is not None and "method" in msg else None
        is_request = msg is not None and "method" in msg and "id" in msg
        sent = False
        try:
            session = self.session_id
            async with self._http.stream(
                "POST", self.url, content=body, headers=self._request_headers(msg)
            ) as response:
                sent = True
                if response.status_code == 404 and session and not renewed and self._init:
                    # the server forgot the session (it restarted, or the session expired):
                    # it did not run this; open a new session as MCP says, then send it once
                    await response.aclose()
                    if await self._renew(session):
                        await self._post(body, msg, renewed=True)
                        return
                if msg is not None and msg.get("method") == "initialize":
                    self.session_id = response.headers.get(SESSION_HEADER) or self.session_id
                if not is_request:
                    if response.status_code >= 400:
                        log.warning("mcp_proxy.http_refused", status=response.status_code)
                    elif msg is not None and msg.get("method") == "notifications/initialized":
                        self._open_get_stream()
                    return
                await self._answer(response, rid)
        except asyncio.CancelledError:
            raise
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.UnsupportedProtocol) as exc:
            if is_request:
                self._error(
                    rid,
                    f"cannot reach {self.url} ({type(exc).__name__}: {exc}); nothing was sent",
                    True,
                )
        except Exception as exc:
            if is_request:
                what = "the request was sent; whether it ran is unknown" if sent else "unknown"
                self._error(rid, f"the HTTP exchange with {self.url} broke ({exc!r}): {what}")

    async def _renew(self, expired: str) -> bool:
        """A new session with the client's ``initialize`` (the proxy's own request, its answer
        kept from the client), once for all the requests that found ``expired`` gone."""
        assert self._http is not None
        async with self._renewing:
            if self.session_id != expired:
                return self.session_id is not None
            self._renewals += 1
            init = {
                "jsonrpc": "2.0",
                "id": f"{MCP_PROXY_ID_PREFIX}renew-{self._renewals}",
                "method": "initialize",
                "params": self._init,
            }
            headers = self._request_headers(None)
            headers.pop(SESSION_HEADER, None)
            headers.pop(VERSION_HEADER, None)
            try:
                async with self._http.stream(
                    "POST", self.url, json=init, headers=headers
                ) as response:
                    sid = response.headers.get(SESSION_HEADER)
                    ctype = response.headers.get("content-type", "").split(";")[0].strip()
                    if response.status_code != 200 or sid is None:
                        return False
                    if ctype == "application/json":
                        answer = parse(await response.aread())
                    else:
                        answer = None
                        async for line in _events(response):
                            answer = parse(line)
                            if answer is not None and answer.get("id") == init["id"]:
                                break
                    if answer is None or "result" not in answer:
                        return False
                self.session_id = sid
                note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                await self._http.post(self.url, json=note, headers=self._request_headers(note))
            except Exception as exc:
                log.warning("mcp_proxy.http_renew_failed", error=repr(exc))
                return False
            log.info("mcp_proxy.http_session_renewed", url=self.url)
            if self._get is not None:
                self._get.cancel()
                self._get = None
            self._open_get_stream()
            return True

    async def _answer(self, response: httpx2.Response, rid: Any) -> None:
        status = response.status_code
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if status >= 300:
            body = await response.aread()
            error = parse(body) if ctype == "application/json" else None
            if error is not None and isinstance(error.get("error"), dict):
                err = dict(error["error"])
                data = err.get("data")
                if status < 500 and self._own(rid) and (data is None or isinstance(data, dict)):
                    err["data"] = {**(data or {}), NOT_SENT_DATA: True}  # refused: it did not run
                self._deliver({"jsonrpc": "2.0", "id": rid, "error": err})
                return
            ended = status == 404 and self.session_id is not None
            why = "the server no longer knows this session" if ended else f"HTTP {status}"
            if status < 500:  # refused before it ran (or a redirect, not followed)
                self._error(rid, f"{self.url} answered {why}; it did not run it", True, -32600)
            else:
                self._error(rid, f"{self.url} answered HTTP {status}; whether it ran is unknown")
            return
        if status == 202:
            self._error(rid, f"{self.url} accepted the request but sent no answer")
            return
        if ctype == "application/json":
            self._deliver(_line(await response.aread()))
            return
        if ctype != "text/event-stream":
            self._error(rid, f"{self.url} answered with content type {ctype!r}")
            return
        async for line in _events(response):
            self._deliver(line)
            msg = parse(line)
            if msg is not None and "method" not in msg and msg.get("id") == rid:
                return
        self._error(rid, f"{self.url} closed the stream before answering; outcome unknown")

    def _own(self, rid: Any) -> bool:
        """Whether ``rid`` is one of the proxy's own requests (a client's errors pass as sent)."""
        return isinstance(rid, str) and rid in self._pending

    def _error(self, rid: Any, text: str, not_sent: bool = False, code: int = -32000) -> None:
        error: dict[str, Any] = {"code": code, "message": f"exactcall proxy: {text}"}
        if not_sent:
            error["data"] = {NOT_SENT_DATA: True}
        self._deliver({"jsonrpc": "2.0", "id": rid, "error": error})

    def _open_get_stream(self) -> None:
        if self._get is None and self.session_id is not None:
            self._get = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        """What the server sends outside any request (notifications, its own requests)."""
        assert self._http is not None
        failures = 0
        while not self._stopped and failures < GET_RETRIES:
            headers = self._request_headers(None)
            headers["accept"] = "text/event-stream"
            try:
                async with self._http.stream("GET", self.url, headers=headers) as response:
                    if response.status_code == 405:  # the server offers no such stream
                        return
                    if response.status_code >= 400:
                        failures += 1
                    else:
                        failures = 0
                        async for line in _events(response):
                            self._deliver(line)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.debug("mcp_proxy.http_get_stream", error=repr(exc))
            await asyncio.sleep(min(0.5 * 2**failures, 5.0))

    async def stop(self, grace: float = 2.0) -> int | None:
        """End the session (``DELETE``) and close the connections."""
        self._stopped = True
        for task in [*self._tasks, *([self._get] if self._get else [])]:
            task.cancel()
        http = self._http
        if http is not None:
            if self.session_id is not None:
                with contextlib.suppress(Exception):
                    headers = self._request_headers(None)
                    await asyncio.wait_for(http.delete(self.url, headers=headers), grace)
            with contextlib.suppress(Exception):
                await http.aclose()
        self._inbox.put_nowait(b"")
        return None


def _line(body: bytes) -> bytes:
    """One JSON message as one line (a pretty-printed body is re-encoded)."""
    body = body.strip()
    if b"\n" not in body:
        return body + b"\n"
    value = parse(body)
    return encode(value) if value is not None else body.replace(b"\n", b" ") + b"\n"


async def _events(response: httpx2.Response) -> Any:
    """The data of each ``message`` event of a server-sent event stream, as a line."""
    data: list[str] = []
    event = "message"
    async for raw in response.aiter_lines():
        line = raw.rstrip("\r")
        if not line:
            if data and event == "message":
                yield _line("\n".join(data).encode())
            data, event = [], "message"
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
    if data and event == "message":
        yield _line("\n".join(data).encode())
