"""Tests for the demo bank (``exactcall.demo.bank``): a real local HTTP server over SQLite.

Plain synchronous tests; the client is ``urllib.request`` (``http.client`` where a
client-side timeout must be provoked without leaking a socket).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from exactcall.demo.bank import Bank, main

REPO_ROOT = Path(__file__).resolve().parents[1]


class Reply:
    """A fully-read HTTP response."""

    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.json: Any = json.loads(body) if body else None


def call(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Reply:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Reply(error.code, error.headers, error.read())


def pay(bank: Bank, body: Any, key: str | None = None) -> Reply:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return call("POST", f"{bank.url}/payments", body, headers)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def bank(tmp_path: Path) -> Iterator[Bank]:
    with Bank(tmp_path / "bank.db") as started:
        yield started


def test_health_and_url(bank: Bank) -> None:
    assert bank.url.startswith("http://127.0.0.1:")
    reply = call("GET", f"{bank.url}/health")
    assert (reply.status, reply.json) == (200, {"ok": True})


def test_payment_is_created(bank: Bank) -> None:
    reply = pay(bank, {"amount": 500, "to": "alice", "memo": "rent"}, key="k-1")

    assert reply.status == 201
    assert reply.headers.get("Idempotent-Replayed") is None
    assert reply.json == {
        "payment_id": reply.json["payment_id"],
        "amount": 500,
        "to": "alice",
        "memo": "rent",
        "idempotency_key": "k-1",
        "status": "succeeded",
    }
    assert isinstance(reply.json["payment_id"], int)
    assert bank.count() == 1
    [row] = bank.payments()
    assert row["id"] == reply.json["payment_id"]
    assert (row["amount"], row["to_account"], row["idempotency_key"]) == (500, "alice", "k-1")
    assert row["request_count"] == 1
    assert row["created_at"]


def test_same_key_same_body_replays_original(bank: Bank) -> None:
    first = pay(bank, {"amount": 100, "to": "bob"}, key="k-replay")
    # Same body with another key order: canonical JSON is equal.
    second = pay(bank, {"to": "bob", "amount": 100}, key="k-replay")

    assert first.status == 201
    assert second.status == 200
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert second.json == first.json
    assert bank.count() == 1
    assert bank.payments()[0]["request_count"] == 2


def test_same_key_different_body_conflicts(bank: Bank) -> None:
    assert pay(bank, {"amount": 100, "to": "bob"}, key="k-conflict").status == 201
    reply = pay(bank, {"amount": 999, "to": "bob"}, key="k-conflict")

    assert reply.status == 409
    assert reply.json["error"]["code"] == "idempotency_key_reused"
    assert bank.count() == 1
    assert bank.payments()[0]["amount"] == 100


def test_no_key_twice_creates_two_payments(bank: Bank) -> None:
    first = pay(bank, {"amount": 7, "to": "carol"})
    second = pay(bank, {"amount": 7, "to": "carol"})

    assert (first.status, second.status) == (201, 201)
    assert first.json["payment_id"] != second.json["payment_id"]
    assert first.json["idempotency_key"] is None
    assert bank.count() == 2
    assert bank.count(to="carol") == 2
    assert bank.count(to="nobody") == 0


def test_fail_next_answers_error_and_stores_nothing(bank: Bank) -> None:
    faults = call("POST", f"{bank.url}/faults", {"fail_next": 2, "status": 503})
    assert faults.status == 200
    assert faults.json["fail_next"] == 2

    for _ in range(2):
        reply = pay(bank, {"amount": 1, "to": "dave"}, key="k-fault")
        assert reply.status == 503
        assert reply.json["error"]["code"] == "injected_fault"
    assert bank.count() == 0

    reply = pay(bank, {"amount": 1, "to": "dave"}, key="k-fault")
    assert reply.status == 201  # the key was not burnt by the injected failures
    assert bank.count() == 1


def test_fault_status_is_configurable_and_empty_body_clears(bank: Bank) -> None:
    call("POST", f"{bank.url}/faults", {"fail_next": 5, "status": 500})
    assert pay(bank, {"amount": 1, "to": "erin"}).status == 500
    cleared = call("POST", f"{bank.url}/faults", {})
    assert cleared.json == {"fail_next": 0, "status": 503, "delay_ms": 0}
    assert call("GET", f"{bank.url}/faults").json == cleared.json
    assert pay(bank, {"amount": 1, "to": "erin"}).status == 201


def test_invalid_fault_config_is_rejected(bank: Bank) -> None:
    assert call("POST", f"{bank.url}/faults", {"fail_next": -1}).status == 400
    assert call("POST", f"{bank.url}/faults", {"fail_next": 1, "status": 200}).status == 400
    assert call("POST", f"{bank.url}/faults", {"delay_ms": "x"}).status == 400


def test_delay_ms_slows_payments(bank: Bank) -> None:
    call("POST", f"{bank.url}/faults", {"delay_ms": 300})
    started = time.monotonic()
    reply = pay(bank, {"amount": 3, "to": "frank"})
    assert reply.status == 201
    assert time.monotonic() - started >= 0.3


def test_client_timeout_during_delay_is_ambiguous_then_replays(bank: Bank) -> None:
    """The client gives up, yet the payment commits: only the key makes the retry safe."""
    call("POST", f"{bank.url}/faults", {"delay_ms": 400})
    body = json.dumps({"amount": 42, "to": "grace"})
    url = urlsplit(bank.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=0.1)
    try:
        conn.request("POST", "/payments", body, {"Idempotency-Key": "k-ambiguous"})
        with pytest.raises(TimeoutError):
            conn.getresponse()
    finally:
        conn.close()

    assert wait_until(lambda: bank.count() == 1)
    call("POST", f"{bank.url}/faults", {})
    retry = pay(bank, json.loads(body), key="k-ambiguous")
    assert retry.status == 200
    assert retry.headers.get("Idempotent-Replayed") == "true"
    assert bank.count() == 1


@pytest.mark.parametrize(
    ("raw", "headers"),
    [
        (b"{not json", {}),
        (b"[1, 2]", {}),
        (b"", {}),
        (json.dumps({"to": "alice"}).encode(), {}),
        (json.dumps({"amount": 10}).encode(), {}),
        (json.dumps({"amount": "10", "to": "alice"}).encode(), {}),
        (json.dumps({"amount": True, "to": "alice"}).encode(), {}),
        (json.dumps({"amount": 0, "to": "alice"}).encode(), {}),
        (json.dumps({"amount": 10, "to": ""}).encode(), {}),
        (json.dumps({"amount": 10, "to": "alice", "memo": 5}).encode(), {}),
        (json.dumps({"amount": 10, "to": "alice", "extra": 1}).encode(), {}),
        (json.dumps({"amount": 10, "to": "alice"}).encode(), {"Idempotency-Key": " "}),
        (json.dumps({"amount": 10, "to": "alice"}).encode(), {"Idempotency-Key": "k" * 256}),
    ],
)
def test_bad_input_is_rejected_and_nothing_stored(
    bank: Bank, raw: bytes, headers: dict[str, str]
) -> None:
    reply = call("POST", f"{bank.url}/payments", headers=headers, raw=raw)
    assert reply.status == 400
    assert isinstance(reply.json["error"]["message"], str)
    assert bank.count() == 0
    with contextlib.closing(sqlite3.connect(bank.db_path)) as db:
        assert db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0] == 0


def test_unknown_route_is_404(bank: Bank) -> None:
    assert call("GET", f"{bank.url}/nope").status == 404
    assert call("POST", f"{bank.url}/nope", {}).status == 404


def test_get_payments_filters_by_idempotency_key(bank: Bank) -> None:
    pay(bank, {"amount": 1, "to": "alice"}, key="k-a")
    pay(bank, {"amount": 2, "to": "bob"}, key="k-b")
    pay(bank, {"amount": 3, "to": "bob"})

    everything = call("GET", f"{bank.url}/payments").json
    assert everything["count"] == 3
    assert [p["amount"] for p in everything["payments"]] == [1, 2, 3]

    only_b = call("GET", f"{bank.url}/payments?idempotency_key=k-b").json
    assert only_b["count"] == 1
    [row] = only_b["payments"]
    assert (row["amount"], row["to_account"], row["idempotency_key"]) == (2, "bob", "k-b")

    unknown = call("GET", f"{bank.url}/payments?idempotency_key=k-missing").json
    assert unknown == {"payments": [], "count": 0}
    assert bank.payments(idempotency_key="k-a")[0]["amount"] == 1


def test_get_count_optionally_by_recipient(bank: Bank) -> None:
    pay(bank, {"amount": 1, "to": "alice"})
    pay(bank, {"amount": 2, "to": "bob"})
    pay(bank, {"amount": 3, "to": "bob"})
    assert call("GET", f"{bank.url}/payments/count").json == {"count": 3}
    assert call("GET", f"{bank.url}/payments/count?to=bob").json == {"count": 2}


def test_reset_deletes_payments_and_receipts(bank: Bank) -> None:
    pay(bank, {"amount": 1, "to": "alice"}, key="k-reset")
    reply = call("POST", f"{bank.url}/reset")
    assert reply.json == {"ok": True, "deleted": 1}
    assert bank.count() == 0
    # The receipt is gone too, so the key creates a fresh payment.
    assert pay(bank, {"amount": 5, "to": "alice"}, key="k-reset").status == 201


def test_every_receipt_has_its_payment(bank: Bank) -> None:
    for i in range(5):
        pay(bank, {"amount": i + 1, "to": "alice"}, key=f"k-{i}")
        pay(bank, {"amount": i + 1, "to": "alice"}, key=f"k-{i}")  # replay
        pay(bank, {"amount": i + 1, "to": "alice"})  # keyless

    with contextlib.closing(sqlite3.connect(bank.db_path)) as db:
        orphans = db.execute(
            "SELECT COUNT(*) FROM receipts r LEFT JOIN payments p ON p.id = r.payment_id"
            " WHERE p.id IS NULL"
        ).fetchone()[0]
        unreceipted = db.execute(
            "SELECT COUNT(*) FROM payments p LEFT JOIN receipts r"
            " ON r.idempotency_key = p.idempotency_key"
            " WHERE p.idempotency_key IS NOT NULL AND r.payment_id IS NOT p.id"
        ).fetchone()[0]
        receipts = db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0]
    assert (orphans, unreceipted, receipts) == (0, 0, 5)
    assert bank.count() == 10


def test_failed_receipt_write_rolls_back_the_payment(bank: Bank) -> None:
    """Payment and receipt share one transaction: if the receipt fails, no payment remains."""
    with contextlib.closing(sqlite3.connect(bank.db_path)) as db:
        db.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON receipts BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
        db.commit()

    reply = pay(bank, {"amount": 9, "to": "heidi"}, key="k-atomic")
    assert reply.status == 500
    assert bank.count() == 0


def test_concurrent_requests_with_one_key_create_one_payment(bank: Bank) -> None:
    replies: list[Reply] = []
    lock = threading.Lock()

    def worker() -> None:
        reply = pay(bank, {"amount": 11, "to": "ivan"}, key="k-race")
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.status for r in replies) == [200] * 7 + [201]
    assert len({r.json["payment_id"] for r in replies}) == 1
    assert bank.count() == 1


def test_two_banks_are_independent(tmp_path: Path) -> None:
    with Bank(tmp_path / "a.db") as a, Bank(tmp_path / "b.db") as b:
        assert a.url != b.url
        pay(a, {"amount": 1, "to": "alice"})
        assert (a.count(), b.count()) == (1, 0)


def test_lifecycle(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank.db")
    with pytest.raises(RuntimeError):
        _ = bank.url
    url = bank.start()
    try:
        assert url == bank.url
        with pytest.raises(RuntimeError):
            bank.start()
    finally:
        bank.stop()
    bank.stop()  # idempotent
    # Data survives a restart (it lives in the SQLite file).
    with Bank(tmp_path / "bank.db") as again:
        assert again.count() == 0


def test_cli_runs_in_foreground_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    command = [sys.executable, "-m", "exactcall.demo.bank", "--port", "0"]
    command += ["--db", str(tmp_path / "cli.db")]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            assert call("GET", f"{url}/health").json == {"ok": True}
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0


def test_main_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        main(["--port", "not-a-number"])
