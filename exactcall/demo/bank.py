"""A tiny, real, local HTTP "bank" used by the exactcall demo and tests.

It is the *destination* of the side effects exactcall protects: every accepted
``POST /payments`` writes one row to a SQLite file, so tests can count exactly how
many times money actually moved, independently of what the client believes.

The bank implements Stripe-style idempotency keys: the payment row and its receipt
are written in the same SQLite transaction, a repeated key with the same body replays
the original response (``200`` + ``Idempotent-Replayed: true``), and a repeated key
with a different body is rejected with ``409``.

Failure injection (``POST /faults``) lets tests produce definite failures
(``fail_next``: answer an error status without creating anything) and ambiguous ones
(``delay_ms``: the client may time out while the payment still commits).

Endpoints::

    POST /payments                 {"amount": int, "to": str, "memo": str?} (+ Idempotency-Key)
    GET  /payments[?idempotency_key=K][&to=ACCOUNT]
    GET  /payments/count[?to=ACCOUNT]
    GET  /health
    GET  /faults
    POST /faults                   {"fail_next": N, "status": 503, "delay_ms": M}; {} clears
    POST /reset                    delete all payments and receipts

Only the standard library is used. Run it standalone with::

    python -m exactcall.demo.bank --port 8765 --db ./bank.db
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeGuard
from urllib.parse import parse_qs, urlsplit

from exactcall._serve import ServedHTTP

__all__ = ["Bank", "main"]

MAX_BODY_BYTES = 1 << 20
MAX_KEY_LENGTH = 255
MAX_AMOUNT = 10**12
PAYMENT_FIELDS = frozenset({"amount", "to", "memo"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY,
    amount INTEGER NOT NULL,
    to_account TEXT NOT NULL,
    memo TEXT NULL,
    idempotency_key TEXT NULL,
    created_at TEXT NOT NULL,
    request_count INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS payments_idempotency_key ON payments(idempotency_key);
CREATE INDEX IF NOT EXISTS payments_to_account ON payments(to_account);
CREATE TABLE IF NOT EXISTS receipts (
    idempotency_key TEXT PRIMARY KEY,
    payment_id INTEGER NOT NULL REFERENCES payments(id),
    request_json TEXT NOT NULL,
    response_json TEXT NOT NULL
);
"""


class BadRequest(Exception):
    """A client error that maps to an HTTP status and a JSON error body."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


@dataclass(frozen=True)
class PaymentResult:
    """Outcome of ``POST /payments``: HTTP status, JSON body, and whether it was replayed."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


# --------------------------------------------------------------------------- storage


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def canonical_json(value: Any) -> str:
    """The canonical form used to compare a replayed request with the original one."""
    return json.dumps(value, sort_keys=True)


class Store:
    """SQLite-backed payments ledger; opens a fresh connection per operation (thread-safe)."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = os.fspath(db_path)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 30000")
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE ... COMMIT`` (rolled back on any exception)."""
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def init_schema(self) -> None:
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)

    def create_payment(self, request: dict[str, Any], key: str | None) -> PaymentResult:
        """Create a payment (and its receipt, atomically) or replay/reject a reused key."""
        request_json = canonical_json(request)
        with self.transaction() as conn:
            if key is not None:
                receipt = conn.execute(
                    "SELECT payment_id, request_json, response_json FROM receipts"
                    " WHERE idempotency_key = ?",
                    (key,),
                ).fetchone()
                if receipt is not None:
                    return self._replay(conn, receipt, request_json)
            body = self._insert_payment(conn, request, key)
            if key is not None:
                conn.execute(
                    "INSERT INTO receipts (idempotency_key, payment_id, request_json,"
                    " response_json) VALUES (?, ?, ?, ?)",
                    (key, body["payment_id"], request_json, json.dumps(body)),
                )
            return PaymentResult(HTTPStatus.CREATED, body)

    @staticmethod
    def _replay(conn: sqlite3.Connection, receipt: sqlite3.Row, request_json: str) -> PaymentResult:
        if receipt["request_json"] != request_json:
            raise BadRequest(
                "Keys for idempotent requests can only be used with the same parameters"
                " they were first used with.",
                status=HTTPStatus.CONFLICT,
                code="idempotency_key_reused",
            )
        conn.execute(
            "UPDATE payments SET request_count = request_count + 1 WHERE id = ?",
            (receipt["payment_id"],),
        )
        return PaymentResult(HTTPStatus.OK, json.loads(receipt["response_json"]), replayed=True)

    @staticmethod
    def _insert_payment(
        conn: sqlite3.Connection, request: dict[str, Any], key: str | None
    ) -> dict[str, Any]:
        cursor = conn.execute(
            "INSERT INTO payments (amount, to_account, memo, idempotency_key, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (request["amount"], request["to"], request.get("memo"), key, _now()),
        )
        return {
            "payment_id": cursor.lastrowid,
            "amount": request["amount"],
            "to": request["to"],
            "memo": request.get("memo"),
            "idempotency_key": key,
            "status": "succeeded",
        }

    def payments(
        self, idempotency_key: str | None = None, to: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = _filters(idempotency_key=idempotency_key, to_account=to)
        with self.connect() as conn:
            rows = conn.execute(f"SELECT * FROM payments{where} ORDER BY id", params).fetchall()
        return [dict(row) for row in rows]

    def count(self, to: str | None = None) -> int:
        where, params = _filters(to_account=to)
        with self.connect() as conn:
            row = conn.execute(f"SELECT COUNT(*) FROM payments{where}", params).fetchone()
        return int(row[0])

    def reset(self) -> int:
        with self.transaction() as conn:
            conn.execute("DELETE FROM receipts")
            return conn.execute("DELETE FROM payments").rowcount


def _filters(**columns: str | None) -> tuple[str, list[str]]:
    """Build a ``WHERE`` clause from the non-None keyword arguments (column names are ours)."""
    used = {name: value for name, value in columns.items() if value is not None}
    if not used:
        return "", []
    return " WHERE " + " AND ".join(f"{name} = ?" for name in used), list(used.values())


# --------------------------------------------------------------------------- validation


def _parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object")
    return value


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_payment(raw: bytes) -> dict[str, Any]:
    """Validate a ``POST /payments`` body; raise :class:`BadRequest` if it is not acceptable."""
    body = _parse_json_object(raw)
    unknown = sorted(set(body) - PAYMENT_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    amount = body.get("amount")
    if not _is_int(amount) or not 0 < amount <= MAX_AMOUNT:
        raise BadRequest(f"'amount' must be an integer between 1 and {MAX_AMOUNT}")
    to = body.get("to")
    if not isinstance(to, str) or not to.strip():
        raise BadRequest("'to' must be a non-empty string")
    memo = body.get("memo")
    if memo is not None and not isinstance(memo, str):
        raise BadRequest("'memo' must be a string or null")
    return body


def parse_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or len(value) > MAX_KEY_LENGTH:
        raise BadRequest(f"Idempotency-Key must be 1..{MAX_KEY_LENGTH} non-blank characters")
    return value


# --------------------------------------------------------------------------- faults


@dataclass
class Faults:
    """Per-bank failure injection, configured over ``POST /faults``."""

    fail_next: int = 0
    status: int = HTTPStatus.SERVICE_UNAVAILABLE
    delay_ms: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def configure(self, config: dict[str, Any]) -> None:
        """Replace the whole configuration (missing fields reset to defaults; ``{}`` clears)."""
        fail_next = config.get("fail_next", 0)
        status = config.get("status", HTTPStatus.SERVICE_UNAVAILABLE)
        delay_ms = config.get("delay_ms", 0)
        if not _is_int(fail_next) or fail_next < 0:
            raise BadRequest("'fail_next' must be a non-negative integer")
        if not _is_int(status) or not 400 <= status <= 599:
            raise BadRequest("'status' must be an HTTP error status (400..599)")
        if not _is_int(delay_ms) or delay_ms < 0:
            raise BadRequest("'delay_ms' must be a non-negative integer")
        with self._lock:
            self.fail_next, self.status, self.delay_ms = fail_next, int(status), delay_ms

    def take_failure(self) -> int | None:
        """Consume one injected failure; return its status, or None if none is pending."""
        with self._lock:
            if self.fail_next <= 0:
                return None
            self.fail_next -= 1
            return self.status

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"fail_next": self.fail_next, "status": self.status, "delay_ms": self.delay_ms}


# --------------------------------------------------------------------------- HTTP


class _BankServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, faults: Faults) -> None:
        super().__init__(address, _Handler)
        self.store = store
        self.faults = faults

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected (delay_ms tests); stay quiet.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _BankServer
    server_version = "exactcall-demo-bank/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request logging."""

    # ---- plumbing

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_error_json(self, status: int, code: str, message: str) -> None:
        self._send_json(status, {"error": {"code": code, "message": message}})

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError as exc:
            raise BadRequest("invalid Content-Length") from exc
        if length < 0:
            raise BadRequest("invalid Content-Length")
        if length > MAX_BODY_BYTES:
            raise BadRequest("request body too large", status=HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        return self.rfile.read(length)

    def _route(self, routes: dict[str, Any]) -> None:
        url = urlsplit(self.path)
        handler = routes.get(url.path.rstrip("/") or "/")
        if handler is None:
            self._send_error_json(HTTPStatus.NOT_FOUND, "not_found", f"no route for {url.path}")
            return
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            handler(query)
        except BadRequest as exc:
            self._send_error_json(exc.status, exc.code, exc.message)
        except (ConnectionError, TimeoutError):
            raise  # the client went away; nothing to answer
        except Exception as exc:  # any failure rolled its transaction back: nothing stored
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error", repr(exc))

    def do_GET(self) -> None:
        self._route(
            {
                "/health": self._get_health,
                "/payments": self._get_payments,
                "/payments/count": self._get_count,
                "/faults": self._get_faults,
            }
        )

    def do_POST(self) -> None:
        self._route(
            {
                "/payments": self._post_payment,
                "/faults": self._post_faults,
                "/reset": self._post_reset,
            }
        )

    # ---- GET

    def _get_health(self, _query: dict[str, str]) -> None:
        self._send_json(HTTPStatus.OK, {"ok": True})

    def _get_payments(self, query: dict[str, str]) -> None:
        rows = self.server.store.payments(query.get("idempotency_key"), query.get("to"))
        self._send_json(HTTPStatus.OK, {"payments": rows, "count": len(rows)})

    def _get_count(self, query: dict[str, str]) -> None:
        self._send_json(HTTPStatus.OK, {"count": self.server.store.count(query.get("to"))})

    def _get_faults(self, _query: dict[str, str]) -> None:
        self._send_json(HTTPStatus.OK, self.server.faults.snapshot())

    # ---- POST

    def _post_payment(self, _query: dict[str, str]) -> None:
        raw = self._read_body()
        faults = self.server.faults
        delay_ms = faults.snapshot()["delay_ms"]
        if delay_ms:
            time.sleep(delay_ms / 1000)
        failure = faults.take_failure()
        if failure is not None:
            self._send_error_json(failure, "injected_fault", "injected failure; nothing created")
            return
        key = parse_idempotency_key(self.headers.get("Idempotency-Key"))
        result = self.server.store.create_payment(parse_payment(raw), key)
        headers = {"Idempotent-Replayed": "true"} if result.replayed else None
        self._send_json(result.status, result.body, headers)

    def _post_faults(self, _query: dict[str, str]) -> None:
        raw = self._read_body()
        self.server.faults.configure(_parse_json_object(raw) if raw.strip() else {})
        self._send_json(HTTPStatus.OK, self.server.faults.snapshot())

    def _post_reset(self, _query: dict[str, str]) -> None:
        self._read_body()
        deleted = self.server.store.reset()
        self._send_json(HTTPStatus.OK, {"ok": True, "deleted": deleted})


# --------------------------------------------------------------------------- public API


class Bank(ServedHTTP):
    """A local fake bank: an HTTP server in a daemon thread over one SQLite file.

    >>> with Bank(tmp_path / "bank.db") as bank:   # doctest: +SKIP
    ...     urllib.request.urlopen(bank.url + "/health")
    """

    def __init__(
        self, db_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.db_path = os.fspath(db_path)
        self.host = host
        self.port = port
        self.store = Store(self.db_path)
        self.faults = Faults()

    def start(self) -> str:
        """Create the schema, bind, serve in a daemon thread; return the base URL."""
        self.store.init_schema()
        return super().start()

    def _make_server(self) -> _BankServer:
        return _BankServer((self.host, self.port), self.store, self.faults)

    # ---- direct (non-HTTP) access to the ledger

    def count(self, to: str | None = None) -> int:
        """Number of payments actually stored (optionally for one recipient)."""
        return self.store.count(to)

    def payments(self, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        """All stored payment rows (optionally those with one idempotency key), oldest first."""
        return self.store.payments(idempotency_key)

    def reset(self) -> None:
        """Delete all payments and receipts."""
        self.store.reset()


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Run a bank in the foreground until Ctrl-C / SIGTERM; print its URL first."""
    parser = argparse.ArgumentParser(prog="python -m exactcall.demo.bank", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--db", default="./bank.db", help="SQLite file (created if missing)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    with contextlib.suppress(ValueError):  # signal handlers only work in the main thread
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Bank(args.db, host=args.host, port=args.port) as bank:
        print(bank.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(0.5):
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
