"""``exactcall chaos``: does your agent repeat an action when a response gets lost?

An agent that calls an API over HTTP cannot tell "the request never arrived" from "it
arrived, the action happened, and only the answer was lost". A naive retry in the second
case does the action twice: two payments, two e-mails, two tickets. This module makes that
case happen on purpose and counts the consequences.

:class:`ChaosProxy` is a small HTTP proxy on ``127.0.0.1`` that sits between an agent and
an API (a real one given by ``upstream=``, or a built-in mock). For every *distinct* write
request (``POST``, ``PUT``, ``PATCH``, ``DELETE``; identity = method + path + canonical
body) it lets the first attempt execute, then drops the response: it closes the connection
without answering (``drop-response``), answers ``502`` (``error-after-commit``), or holds the
answer ``late_by`` seconds, longer than a client's own timeout (``late-response``). Later
attempts with the same identity pass through. Reads always pass through untouched.

Afterwards :meth:`ChaosProxy.report` says, for each write action, how many times it reached
the upstream. A retry that carries an ``Idempotency-Key`` already used for that action is
*protected* (the upstream is expected to deduplicate it); any other repeat is a
*DUPLICATE*. :func:`run_chaos` wraps a command with a proxy (``EXACTCALL_CHAOS_URL`` in its
environment) and prints that report; it is what the ``exactcall chaos`` command runs.

The proxy only ever talks to the upstream it was given. Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from exactcall._serve import ServedHTTP

__all__ = ["ENV_VAR", "FAULTS", "Action", "ChaosProxy", "ChaosReport", "run_chaos"]

ENV_VAR = "EXACTCALL_CHAOS_URL"
FAULTS = ("drop-response", "error-after-commit", "late-response")
Fault = Literal["drop-response", "error-after-commit", "late-response"]
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_BODY_BYTES = 64 << 20
# Never forwarded in either direction: hop-by-hop headers (RFC 9110 §7.6.1) and the ones the
# proxy recomputes itself because it buffers whole bodies.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
    }
)

Identity = tuple[str, str, bytes]


class UpstreamError(Exception):
    """The upstream was unreachable or did not answer (``sent``: whether it got the request)."""

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True)
class Reply:
    """A complete HTTP response: status, headers (duplicates allowed), body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


# --------------------------------------------------------------------------- bookkeeping


@dataclass
class Action:
    """One distinct write request and what happened to it."""

    method: str
    path: str
    body: str
    executions: int = 0
    idempotency_keys: list[str | None] = field(default_factory=list)
    response_dropped: bool = False
    protected_retries: int = 0
    duplicate_retries: int = 0

    @property
    def verdict(self) -> str:
        """``once``, ``protected`` (repeats all carried a known key), ``DUPLICATE``, or
        ``not executed`` (it never reached the upstream)."""
        if self.duplicate_retries:
            return "DUPLICATE"
        if self.protected_retries:
            return "protected"
        return "once" if self.executions else "not executed"

    def record(self, key: str | None) -> None:
        """Count one execution upstream; classify it if it is a repeat."""
        if self.executions:
            if key is not None and key in self.idempotency_keys:
                self.protected_retries += 1
            else:
                self.duplicate_retries += 1
        self.executions += 1
        self.idempotency_keys.append(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "body": self.body,
            "executions": self.executions,
            "idempotency_keys": list(self.idempotency_keys),
            "response_dropped": self.response_dropped,
            "protected_retries": self.protected_retries,
            "duplicate_retries": self.duplicate_retries,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class ChaosReport:
    """What a :class:`ChaosProxy` saw: the write actions (first-seen order) and read count."""

    upstream: str
    fault: str
    actions: list[Action]
    reads: int
    command: list[str] | None = None
    command_exit_code: int | None = None

    @property
    def duplicates(self) -> list[Action]:
        return [a for a in self.actions if a.verdict == "DUPLICATE"]

    @property
    def protected(self) -> list[Action]:
        return [a for a in self.actions if a.verdict == "protected"]

    @property
    def exit_code(self) -> int:
        """1 if any action ran twice unprotected; 2 if the command failed (nothing proven)."""
        if self.duplicates:
            return 1
        return 2 if self.command_exit_code else 0

    def totals(self) -> dict[str, int]:
        return {
            "actions": len(self.actions),
            "executions": sum(a.executions for a in self.actions),
            "responses_dropped": sum(a.response_dropped for a in self.actions),
            "duplicate": len(self.duplicates),
            "protected": len(self.protected),
            "once": sum(a.verdict == "once" for a in self.actions),
            "reads": self.reads,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream,
            "fault": self.fault,
            "actions": [a.to_dict() for a in self.actions],
            "totals": self.totals(),
            "command": self.command,
            "command_exit_code": self.command_exit_code,
            "exit_code": self.exit_code,
        }

    def format(self) -> str:
        """The human-readable report: a table, totals, the command's exit code, a conclusion."""
        lines = [f"exactcall chaos: upstream={self.upstream} fault={self.fault}", ""]
        lines += _table(self.actions) if self.actions else ["  (no write requests were seen)"]
        t = self.totals()
        lines += [
            "",
            f"totals: {t['actions']} write action(s), {t['executions']} execution(s), "
            f"{t['responses_dropped']} first response(s) dropped, {t['reads']} read(s) passed",
            f"        {t['duplicate']} DUPLICATE, {t['protected']} protected "
            f"(same Idempotency-Key), {t['once']} once",
        ]
        if self.command_exit_code is not None:
            lines.append(f"command exit code: {self.command_exit_code}")
        lines.append(self._conclusion())
        return "\n".join(lines)

    def _conclusion(self) -> str:
        if self.duplicates:
            return (
                f"DUPLICATE: {len(self.duplicates)} action(s) executed more than once "
                "after a lost response"
            )
        if self.command_exit_code:
            return "the command failed: this run proves nothing (exit 2)"
        if not self.actions:
            return "ok: no write requests, nothing to repeat"
        return "ok: no action was executed twice without the same Idempotency-Key"


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(actions: Iterable[Action]) -> list[str]:
    header = ("METHOD", "PATH", "BODY", "EXECUTIONS", "FIRST RESPONSE", "VERDICT")
    rows = [
        (
            a.method,
            _short(a.path),
            _short(a.body) or "-",
            str(a.executions),
            "dropped" if a.response_dropped else "returned",
            "protected (same Idempotency-Key)" if a.verdict == "protected" else a.verdict,
        )
        for a in actions
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def canonical_body(raw: bytes) -> bytes:
    """JSON bodies with sorted keys and compact separators; any other body as it is."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------- upstreams


class _Mock:
    """Stands in for an API: writes get ``201 {"id": n, "mock": true}``, reads ``200 {}``.

    Like a well-behaved API it replays the first answer to a repeat that carries an
    ``Idempotency-Key`` it already saw for the same request.
    """

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._by_key: dict[tuple[Identity, str], int] = {}
        self._lock = threading.Lock()

    def __call__(self, method: str, identity: Identity | None, key: str | None) -> Reply:
        if identity is None:
            body = b"" if method == "HEAD" else b"{}"
            return Reply(HTTPStatus.OK, [("Content-Type", "application/json")], body)
        with self._lock:
            n = self._by_key.get((identity, key)) if key is not None else None
            replayed = n is not None
            if n is None:
                n = next(self._ids)
                if key is not None:
                    self._by_key[(identity, key)] = n
        headers = [("Content-Type", "application/json")]
        if replayed:
            headers.append(("Idempotent-Replayed", "true"))
        return Reply(HTTPStatus.CREATED, headers, json.dumps({"id": n, "mock": True}).encode())


def _parse_upstream(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream must be an http:// or https:// URL, not {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"upstream must be a base URL without query or fragment: {url!r}")
    parts.port  # noqa: B018 - raises ValueError for a bad port
    return parts


def _forward(
    base: SplitResult,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    timeout: float,
) -> Reply:
    """Send one request to the upstream on a fresh connection and read the whole answer."""
    cls = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
    conn = cls(base.hostname or "", base.port, timeout=timeout)
    sent = False
    try:
        conn.putrequest(
            method, base.path.rstrip("/") + target, skip_host=True, skip_accept_encoding=True
        )
        conn.putheader("Host", base.netloc.rpartition("@")[2])
        for name, value in headers:
            conn.putheader(name, value)
        if body or method in WRITE_METHODS:
            conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Connection", "close")
        conn.endheaders(body or None)
        sent = True
        with conn.getresponse() as resp:
            data = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if method == "HEAD" and resp.getheader("Content-Length") is not None:
                kept.append(("Content-Length", resp.getheader("Content-Length", "")))
            return Reply(resp.status, kept, data)
    except (OSError, http.client.HTTPException) as exc:
        raise UpstreamError(f"{type(exc).__name__}: {exc}", sent) from exc
    finally:
        conn.close()


# --------------------------------------------------------------------------- HTTP proxy


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], proxy: ChaosProxy) -> None:
        super().__init__(address, _Handler)
        self.proxy = proxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that hung up (or a connection we dropped on purpose)
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "exactcall-chaos/1.0"
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request logging."""

    def _handle(self) -> None:
        try:
            body = self._read_body()
        except ValueError as exc:
            self.close_connection = True
            self._send(_error_reply(HTTPStatus.BAD_REQUEST, "bad_request", str(exc)))
            return
        reply = self.server.proxy._exchange(self.command, self._target(), self._headers(), body)
        if reply is None:
            self._drop()
        else:
            self._send(reply)

    do_GET = do_HEAD = do_OPTIONS = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _target(self) -> str:
        """The request target as path + query (absolute-form URIs are reduced to it)."""
        if self.path.startswith(("http://", "https://")):
            parts = urlsplit(self.path)
            return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return self.path if self.path.startswith("/") else "/" + self.path

    def _headers(self) -> list[tuple[str, str]]:
        named = {h.strip().lower() for h in self.headers.get("Connection", "").split(",")}
        drop = _HOP_BY_HOP | named | {"host"}
        return [(k, v) for k, v in self.headers.items() if k.lower() not in drop]

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_BODY_BYTES:
            raise ValueError(f"bad or too large Content-Length: {length}")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024).split(b";")[0].strip()
            size = int(size_line, 16)  # ValueError (-> 400) if missing or not hex
            if size == 0:
                break
            total += size
            if total > MAX_BODY_BYTES:
                raise ValueError("request body too large")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)  # the CRLF after each chunk
        while self.rfile.readline(8192).strip():  # trailers, up to the empty line
            pass
        return b"".join(chunks)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        has_length = False
        for name, value in reply.headers:
            has_length = has_length or name.lower() == "content-length"
            self.send_header(name, value)
        if not has_length:
            self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _drop(self) -> None:
        """Hang up without a single byte of answer (the client sees a disconnect)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _error_reply(status: int, code: str, message: str) -> Reply:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return Reply(status, [("Content-Type", "application/json")], body)


class ChaosProxy(ServedHTTP):
    """An HTTP proxy that loses the first response to every distinct write request.

    >>> with ChaosProxy() as proxy:  # doctest: +SKIP  (the mock upstream)
    ...     agent.run(base_url=proxy.url)
    ... print(proxy.report().format())
    """

    def __init__(
        self,
        upstream: str | None = None,
        fault: Fault | str = "drop-response",
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 60.0,
        late_by: float = 30.0,
    ) -> None:
        """``late_by``: with ``late-response``, how long the first answer is held after the
        upstream committed (longer than the client's timeout, so it gives up first)."""
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, not {fault!r}")
        if late_by < 0:
            raise ValueError(f"late_by must be seconds >= 0, not {late_by!r}")
        self.upstream = upstream
        self.fault = fault
        self.late_by = late_by
        self._stopping = threading.Event()  # ends the held answers' waits
        self.host = host
        self.port = port
        self.timeout = timeout
        self._base = _parse_upstream(upstream) if upstream is not None else None
        self._mock = _Mock() if upstream is None else None
        self._lock = threading.Lock()
        self._actions: dict[Identity, Action] = {}
        self._claimed: set[Identity] = set()
        self._reads = 0

    def _make_server(self) -> _Server:
        self._stopping.clear()
        return _Server((self.host, self.port), self)

    def stop(self) -> None:
        self._stopping.set()  # (closing waits for every request's thread)
        super().stop()

    def report(self) -> ChaosReport:
        """A snapshot of what the proxy has seen so far."""
        with self._lock:
            actions = [
                dataclasses.replace(a, idempotency_keys=list(a.idempotency_keys))
                for a in self._actions.values()
            ]
            reads = self._reads
        return ChaosReport(self.upstream or "mock", self.fault, actions, reads)

    # ---- the exchange (called from the handler threads)

    def _exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Reply | None:
        """Execute one request; return the reply to send, or None to hang up instead."""
        if method not in WRITE_METHODS:
            with self._lock:
                self._reads += 1
            return self._execute(method, target, headers, body, None, None)
        identity = (method, target, canonical_body(body))
        key = next((v for k, v in headers if k.lower() == "idempotency-key"), None)
        with self._lock:
            action = self._actions.setdefault(
                identity, Action(method, target, body.decode("utf-8", "replace"))
            )
            first = identity not in self._claimed
            self._claimed.add(identity)
        try:
            reply = self._execute(method, target, headers, body, identity, key)
        except UpstreamError as exc:
            if first:
                with self._lock:
                    if exc.sent:  # sent, then the answer was lost for real
                        action.response_dropped = True
                    else:  # it never got there: the next attempt counts as the first
                        self._claimed.discard(identity)
            return _error_reply(HTTPStatus.BAD_GATEWAY, "upstream_error", str(exc))
        if not first:
            return reply
        with self._lock:
            action.response_dropped = True
        if self.fault == "drop-response":
            return None
        if self.fault == "late-response":
            self._stopping.wait(self.late_by)  # (this request's thread) the client gave up
            return reply
        return _error_reply(
            HTTPStatus.BAD_GATEWAY, "bad_gateway", "exactcall chaos: upstream response lost"
        )

    def _execute(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
        identity: Identity | None,
        key: str | None,
    ) -> Reply:
        """Send to the upstream (or the mock) and count a write once it has been sent."""
        if self._mock is not None:
            reply = self._mock(method, identity, key)
            self._count(identity, key)
            return reply
        assert self._base is not None
        try:
            reply = _forward(self._base, method, target, headers, body, self.timeout)
        except UpstreamError as exc:
            if exc.sent:
                self._count(identity, key)
            if identity is None:
                return _error_reply(HTTPStatus.BAD_GATEWAY, "upstream_error", str(exc))
            raise
        self._count(identity, key)
        return reply

    def _count(self, identity: Identity | None, key: str | None) -> None:
        if identity is not None:
            with self._lock:
                self._actions[identity].record(key)


# --------------------------------------------------------------------------- command


def run_chaos(
    command: Sequence[str],
    upstream: str | None = None,
    fault: Fault | str = "drop-response",
    port: int = 0,
    as_json: bool = False,
    late_by: float = 30.0,
) -> int:
    """Run ``command`` behind a :class:`ChaosProxy`, print the report, return the exit code.

    Exit 1 if an action ran more than once without a repeated ``Idempotency-Key``; 2 if the
    command failed (or could not start) and nothing was duplicated, or for a usage error (no
    command, a bad upstream URL or fault); 0 otherwise.
    """
    if not command:
        print("exactcall chaos: give the command to run after --", file=sys.stderr)
        return 2
    try:
        proxy = ChaosProxy(upstream, fault=fault, port=port, late_by=late_by)
    except ValueError as exc:
        print(f"exactcall chaos: {exc}", file=sys.stderr)
        return 2
    with proxy:
        print(
            f"exactcall chaos: proxy on {proxy.url} -> {upstream or 'mock'} "
            f"(fault: {fault}); {ENV_VAR}={proxy.url}",
            file=sys.stderr,
            flush=True,
        )
        try:
            code = subprocess.run(list(command), env={**os.environ, ENV_VAR: proxy.url}).returncode
        except OSError as exc:
            print(f"exactcall chaos: cannot run {command[0]!r}: {exc}", file=sys.stderr)
            return 2
        seen = proxy.report()
    report = ChaosReport(seen.upstream, seen.fault, seen.actions, seen.reads, list(command), code)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format())
    return report.exit_code
