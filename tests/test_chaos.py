"""`exactcall chaos`: a proxy that loses the first response to each write, and counts repeats."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from exactcall.cli._main import main
from exactcall.demo.bank import Bank
from exactcall.dev._chaos import ChaosProxy, canonical_body
from tests.conftest import ROOT

PAYMENT = {"amount": 100, "to": "bob", "memo": "rent"}


def pay(base: str, body: dict[str, Any], key: str | None = None, attempts: int = 3) -> Any:
    """A typical agent tool: POST, and retry on connection errors and 5xx (same key, if any)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    for _ in range(attempts):
        request = urllib.request.Request(
            base + "/payments", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code < 500:
                    raise
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
            pass
    raise RuntimeError(f"gave up after {attempts} attempts")


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


def test_naive_retry_against_the_mock_is_a_duplicate() -> None:
    with ChaosProxy() as proxy:
        assert pay(proxy.url, PAYMENT) == {"id": 2, "mock": True}
        assert get(proxy.url + "/payments?x=1") == (200, b"{}")
        report = proxy.report()
    [action] = report.actions
    assert (action.method, action.path, action.executions) == ("POST", "/payments", 2)
    assert action.response_dropped and action.idempotency_keys == [None, None]
    assert action.verdict == "DUPLICATE" and report.exit_code == 1
    assert report.totals()["reads"] == 1
    assert "DUPLICATE" in report.format()


def test_the_same_idempotency_key_on_every_retry_is_protected() -> None:
    with ChaosProxy() as proxy:
        assert pay(proxy.url, PAYMENT, key="k-1") == {"id": 1, "mock": True}  # replayed
        report = proxy.report()
    [action] = report.actions
    assert action.executions == 2 and action.idempotency_keys == ["k-1", "k-1"]
    assert action.verdict == "protected" and report.exit_code == 0
    assert "protected (same Idempotency-Key)" in report.format()


def test_a_new_key_per_retry_does_not_protect() -> None:
    with ChaosProxy() as proxy:
        with pytest.raises(ConnectionError):  # the "agent" mints a fresh key per attempt
            _post_once(proxy.url, PAYMENT, "a")
        _post_once(proxy.url, PAYMENT, "b")
        assert proxy.report().actions[0].verdict == "DUPLICATE"


def test_late_response_answers_after_the_clients_timeout() -> None:
    start = time.monotonic()
    with ChaosProxy(fault="late-response", late_by=60) as proxy:
        request = urllib.request.Request(proxy.url + "/payments", data=b"{}", method="POST")
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            urllib.request.urlopen(request, timeout=0.5)
        _post_once(proxy.url, {}, None)  # the naive retry passes at once
        [action] = proxy.report().actions
    assert time.monotonic() - start < 30  # closing ends the held answer's wait
    assert action.response_dropped and action.executions == 2 and action.verdict == "DUPLICATE"


def test_identity_is_method_path_and_canonical_json_body() -> None:
    assert canonical_body(b'{"b": 1, "a": [1, 2]}') == canonical_body(b'{"a":[1,2],"b":1}')
    assert canonical_body(b"not json") == b"not json"
    with ChaosProxy() as proxy:
        for body in ({"to": "bob", "amount": 1}, {"amount": 1, "to": "bob"}, {"amount": 2}):
            pay(proxy.url, body)
        report = proxy.report()
    assert [a.executions for a in report.actions] == [3, 2]  # reordered keys: same action
    assert [a.verdict for a in report.actions] == ["DUPLICATE", "DUPLICATE"]


def test_error_after_commit_against_the_real_bank(tmp_path: Path) -> None:
    with (
        Bank(tmp_path / "b.db") as bank,
        ChaosProxy(bank.url, fault="error-after-commit") as proxy,
    ):
        naive = pay(proxy.url, {"amount": 5, "to": "naive"})
        keyed = pay(proxy.url, {"amount": 5, "to": "keyed"}, key="pay-keyed-1")
        assert get(proxy.url + "/health") == (200, b'{"ok": true}')
        assert bank.count("naive") == 2  # the lost 502 made the naive agent pay twice
        assert bank.count("keyed") == 1  # the bank deduplicated the keyed retry
        assert naive["payment_id"] != keyed["payment_id"]
        report = proxy.report()
    verdicts = {a.body: a.verdict for a in report.actions}
    assert verdicts == {
        '{"amount": 5, "to": "naive"}': "DUPLICATE",
        '{"amount": 5, "to": "keyed"}': "protected",
    }
    assert all(a.executions == 2 and a.response_dropped for a in report.actions)
    assert report.exit_code == 1


def test_forwarding_passes_method_path_query_headers_and_chunked_bodies(tmp_path: Path) -> None:
    with Bank(tmp_path / "b.db") as bank, ChaosProxy(bank.url) as proxy:
        pay(proxy.url, {"amount": 7, "to": "carol"}, key="k-7")
        status, body = get(proxy.url + "/payments?idempotency_key=k-7")
        assert status == 200 and json.loads(body)["count"] == 1
        conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
        try:  # a retry with a chunked body (same identity: passes through, replayed)
            conn.putrequest("POST", "/payments")
            conn.putheader("Idempotency-Key", "k-7")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            payload = b'{"to": "carol", "amount": 7}'
            conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
            with conn.getresponse() as resp:
                assert resp.status == 200 and resp.getheader("Idempotent-Replayed") == "true"
                assert json.loads(resp.read())["to"] == "carol"
        finally:
            conn.close()
        [action] = proxy.report().actions
    assert action.executions == 3 and action.verdict == "protected"


def test_an_unreachable_upstream_is_a_502_and_nothing_executed() -> None:
    with ChaosProxy("http://127.0.0.1:9", timeout=2) as proxy:
        with pytest.raises(urllib.error.HTTPError) as info:
            _post_once(proxy.url, PAYMENT, None)
        info.value.close()
        assert info.value.code == 502
        [action] = proxy.report().actions
    assert action.executions == 0 and action.verdict == "not executed"


# --------------------------------------------------------------------------- the command

AGENT = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    key = sys.argv[1] if len(sys.argv) > 1 else None
    url = os.environ["EXACTCALL_CHAOS_URL"] + "/payments"
    for attempt in range(3):
        headers = {"Idempotency-Key": key} if key else {}
        req = urllib.request.Request(url, data=b'{"amount": 1}', headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                print("paid", json.load(resp))
                break
        except Exception as exc:
            print("retrying after", type(exc).__name__)
    """
)


def chaos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactcall", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_cli_naive_agent_is_caught() -> None:
    run = chaos("--mock", "--", sys.executable, "-c", AGENT)
    assert run.returncode == 1, run.stderr
    assert "retrying after RemoteDisconnected" in run.stdout
    assert "DUPLICATE" in run.stdout and "command exit code: 0" in run.stdout


def test_cli_keyed_agent_passes_and_json_report() -> None:
    run = chaos("--mock", "--json", "--", sys.executable, "-c", AGENT, "key-1")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout[run.stdout.index("{\n") :])
    assert report["command_exit_code"] == 0 and report["totals"]["protected"] == 1
    [action] = report["actions"]
    assert action["verdict"] == "protected" and action["idempotency_keys"] == ["key-1", "key-1"]
    assert (action["method"], action["path"], action["executions"]) == ("POST", "/payments", 2)


def test_cli_a_failing_command_without_duplicates_exits_2() -> None:
    run = chaos("--mock", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert run.returncode == 2
    assert "command exit code: 3" in run.stdout and "proves nothing" in run.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["chaos", "--mock"],
        ["chaos", "--mock", "--"],
        ["chaos", "--", "true"],
        ["chaos", "--mock", "--upstream", "http://127.0.0.1:1", "--", "true"],
        ["chaos", "--upstream", "ftp://example", "--", "true"],
        ["chaos", "--mock", "--fault", "explode", "--", "true"],
        ["chaos", "--mock", "--fault", "late-response", "--late-by", "-1", "--", "true"],
        ["chaos", "--mock", "--", "/nonexistent/agent"],
    ],
)
def test_cli_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "chaos" in capsys.readouterr().err


# --------------------------------------------------------------------------- helpers


def _post_once(base: str, body: dict[str, Any], key: str | None) -> bytes:
    headers = {"Idempotency-Key": key} if key else {}
    request = urllib.request.Request(
        base + "/payments", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read()
