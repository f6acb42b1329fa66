"""The inbox's HTTP server: stdlib ``ThreadingHTTPServer``, Temporal calls on one event loop.

Every page but the login needs an authenticated approver (``_auth``); every POST must be the
inbox's own (Origin + CSRF token). Reads and decisions go through ``exactcall.approvals`` and
the audit, the same code as the CLI.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from temporalio.client import Client

from exactcall._serve import ServedHTTP
from exactcall.approvals import ApprovalRequest, list_pending, load_signing_key, view
from exactcall.evidence._audit import AuditFilter, audit_rows
from exactcall.inbox import _pages as pages
from exactcall.inbox._auth import COOKIE, Authenticator, Identity, TokenAuth
from exactcall.inbox._decide import decide_from_page, gone, last_outcome, payload_for

__all__ = ["EventLoop", "Inbox"]

T = TypeVar("T")
MAX_FORM = 64 * 1024
RUN_ROWS = 200
LIST_EVERY = 0.5
VERDICTS: tuple[Literal["approve"], Literal["deny"]] = ("approve", "deny")


class EventLoop:
    """An asyncio loop in a daemon thread: the HTTP threads run coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class Inbox(ServedHTTP):
    """The web inbox over one Temporal client (created on ``loop``)."""

    def __init__(
        self,
        client: Client,
        loop: EventLoop,
        auth: Authenticator,
        *,
        host: str = "127.0.0.1",
        port: int = 8300,
        keys_dir: Path | None = None,
    ) -> None:
        self.client, self.loop, self.auth = client, loop, auth
        self.host, self.port, self.keys_dir = host, port, keys_dir
        self._listed: tuple[float, list[ApprovalRequest]] | None = None

    def _make_server(self) -> ThreadingHTTPServer:
        inbox = self

        class Handler(_Handler):
            app = inbox

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        return server

    async def pending(self) -> list[ApprovalRequest]:
        """The waiting calls, read at most every ``LIST_EVERY`` seconds however many pages are
        open (each polls every second)."""
        if self._listed is None or time.monotonic() - self._listed[0] > LIST_EVERY:
            self._listed = (time.monotonic(), await list_pending(self.client))
        return self._listed[1]

    def signing_note(self, who: str) -> str:
        if self.keys_dir is None:
            return (
                "Decisions are sent unsigned unless you choose your key file above (it signs "
                "in this browser). A worker that requires signed decisions refuses unsigned "
                "ones; `exactcall approve ... --key YOURKEY.key.pem` signs from a terminal."
            )
        if (self.keys_dir / f"{who}.key.pem").exists():
            return "Your decisions are signed with your key (held by the inbox)."
        return (
            "The inbox holds no key for you: your decisions go unsigned unless you choose "
            "your key file above (it signs in this browser), and a worker that requires "
            "signatures refuses unsigned ones."
        )

    def signing_key(self, who: str) -> Any:
        if self.keys_dir is None:
            return None
        path = self.keys_dir / f"{who}.key.pem"
        return load_signing_key(path) if path.exists() else None


class _Handler(BaseHTTPRequestHandler):
    app: Inbox
    server_version = "exactcall-inbox"

    def log_message(self, format: str, *args: Any) -> None:  # quiet; errors go to stderr
        pass

    # -- plumbing ------------------------------------------------------------------------
    def _send(self, status: int, html: str, headers: dict[str, str] | None = None) -> None:
        body = html.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def _query(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _form(self) -> dict[str, str] | None:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_FORM:
            return None
        return {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode()).items()}

    def _who(self) -> Identity | None:
        who = self.app.auth.identify(self.headers)  # type: ignore[arg-type]
        if who is not None:
            return who
        path = urlsplit(self.path).path
        if self.app.auth.logs_in and self.command == "GET" and not path.endswith(".part"):
            self._redirect("/login")
        else:
            self._send(
                HTTPStatus.UNAUTHORIZED,
                pages.error_page(
                    "Not signed in", "This inbox shows nothing to a request it cannot authenticate."
                ),
            )
        return None

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/login" and self.app.auth.logs_in:
                return self._send(HTTPStatus.OK, pages.login_page())
            who = self._who()
            if who is None:
                return None
            csrf = self.app.auth.csrf(who)
            q = self._query()
            if path == "/":
                reqs = self.app.loop.run(self.app.pending())
                return self._send(HTTPStatus.OK, pages.inbox_page(reqs, who.name, csrf))
            if path == "/pending.part":
                reqs = self.app.loop.run(self.app.pending())
                return self._send(HTTPStatus.OK, pages.pending_rows(reqs))
            if path in ("/call", "/call.part") and "wf" in q and "step" in q:
                return self._call(path, q, who, csrf)
            if path == "/run" and "wf" in q:
                return self._run(q["wf"], who, csrf)
            return self._send(HTTPStatus.NOT_FOUND, pages.error_page("Not found", path))
        except Exception as exc:  # the page says what failed; the server keeps serving
            return self._send(
                HTTPStatus.BAD_GATEWAY,
                pages.error_page("Could not read from Temporal", f"{type(exc).__name__}: {exc}"),
            )

    def _call(self, path: str, q: dict[str, str], who: Identity, csrf: str) -> None:
        v = self.app.loop.run(view(self.app.client, q["wf"]))
        req = next((r for r in v.pending if r.step == q["step"]), None)
        if path == "/call.part":
            left = last_outcome(v, q["step"]) if req is None else ""
            return self._send(HTTPStatus.OK, pages.call_status(req, q.get("hash", ""), left))
        if req is None:
            said = self.app.loop.run(gone(self.app.client, q["wf"], q["step"], v))
            detail = f"{q['step']} of {q['wf']}: {said}."
            return self._send(HTTPStatus.NOT_FOUND, pages.error_page("Not waiting", detail))
        note = self.app.signing_note(who.name)
        signs: dict[str, str] = {
            v: base64.b64encode(payload_for(req, v, who.name)).decode() for v in VERDICTS
        }
        return self._send(HTTPStatus.OK, pages.call_page(req, who.name, csrf, note, signs))

    def _run(self, wf: str, who: Identity, csrf: str) -> None:
        async def read() -> tuple[list[Any], list[dict[str, Any]]]:
            rows = []
            async for r in audit_rows(self.app.client, AuditFilter(workflow=wf, limit=RUN_ROWS)):
                rows.append(r)
            return (await view(self.app.client, wf)).pending, rows

        pending, rows = self.app.loop.run(read())
        return self._send(HTTPStatus.OK, pages.run_page(wf, pending, rows, who.name, csrf))

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        form = self._form()
        if form is None:
            return self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                pages.error_page("Too large", "form over 64 KiB"),
            )
        if path == "/login" and isinstance(self.app.auth, TokenAuth):
            return self._login(form)
        who = self._who()
        if who is None:
            return None
        refused = self.app.auth.refuse_post(self.headers, form, who)  # type: ignore[arg-type]
        if refused is not None:
            return self._send(HTTPStatus.FORBIDDEN, pages.error_page("Refused", refused))
        if path == "/logout" and isinstance(self.app.auth, TokenAuth):
            self.app.auth.logout(who)
            return self._redirect("/login", {"Set-Cookie": f"{COOKIE}=; Max-Age=0; Path=/"})
        if path == "/decide":
            return self._decide(form, who)
        return self._send(HTTPStatus.NOT_FOUND, pages.error_page("Not found", path))

    def _login(self, form: dict[str, str]) -> None:
        auth = self.app.auth
        assert isinstance(auth, TokenAuth)
        origin = self.headers.get("Origin")
        if origin is None or origin not in auth.origins(self.headers):  # type: ignore[arg-type]
            return self._send(
                HTTPStatus.FORBIDDEN, pages.error_page("Refused", "cross-site login refused")
            )
        sid = auth.login(form.get("token", ""))
        if sid is None:
            return self._send(
                HTTPStatus.UNAUTHORIZED,
                pages.login_page("That token is not valid (it may have been replaced)."),
            )
        secure = "; Secure" if (auth.public_url or "").startswith("https:") else ""
        cookie = f"{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/{secure}"
        return self._redirect("/", {"Set-Cookie": cookie})

    def _decide(self, form: dict[str, str], who: Identity) -> None:
        wf, step, shown = form.get("wf", ""), form.get("step", ""), form.get("hash", "")
        verdict = form.get("decision") or form.get("verdict")  # a signed submit sets verdict
        if not (wf and step and shown) or verdict not in ("approve", "deny"):
            detail = "the form lacks the workflow, step, hash or decision: reload the call's page"
            return self._send(HTTPStatus.BAD_REQUEST, pages.error_page("Incomplete form", detail))
        csrf = self.app.auth.csrf(who)
        decision: Literal["approve", "deny"] = "approve" if verdict == "approve" else "deny"
        try:
            key = self.app.signing_key(who.name)
            answer = self.app.loop.run(
                decide_from_page(
                    self.app.client,
                    wf,
                    step,
                    shown,
                    decision,
                    who.name,
                    form.get("reason"),
                    key,
                    form.get("signature") or None,
                )
            )
        except Exception as exc:
            detail = (
                f"{type(exc).__name__}: {exc}. The decision may not have reached the workflow: "
                "reload the call's page to see where it stands (a call is decided once at most)."
            )
            return self._send(HTTPStatus.BAD_GATEWAY, pages.error_page("Could not decide", detail))
        status = HTTPStatus.OK if answer.accepted else HTTPStatus.CONFLICT
        return self._send(status, pages.answer_page(answer, wf, step, who.name, csrf))
