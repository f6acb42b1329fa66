"""Budgeted tools for tests/test_budgets.py (each test has budgets of its own: a namespace
budget's ledger lives as long as the server)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import exactcall
from tests.tools import FAST, post

refunds = exactcall.Budget("test-refunds", limit=5000, per=timedelta(days=1), measure="amount")
writes_per_run = exactcall.Budget("test-writes-per-run", limit=3, scope="workflow")
strict = exactcall.Budget("test-strict", limit=25, measure="amount", on_exceed="refuse")
release = exactcall.Budget("test-release", limit=100, measure="amount", on_exceed="refuse")
weighted = exactcall.Budget(
    "test-weighted", limit=10, measure=lambda args: args["amount"] * len(args["to"]) % 7
)


@exactcall.tool(budgets=[refunds], heartbeat_timeout=FAST)
def budget_refund(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(budgets=[writes_per_run], heartbeat_timeout=FAST)
def budget_write(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(budgets=[strict], heartbeat_timeout=FAST)
def budget_strict(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(budgets=[release], heartbeat_timeout=FAST)
def budget_release_fail(bank: str, amount: int, to: str, fail: bool = False) -> dict[str, Any]:
    if fail:
        raise exactcall.NotExecuted("declined before sending", retry=False)
    return post(bank, "/payments", {"amount": amount, "to": to})


@exactcall.tool(budgets=[release], heartbeat_timeout=FAST)
def budget_release_unknown(bank: str, amount: int, to: str) -> dict[str, Any]:
    post(bank, "/payments", {"amount": amount, "to": to})
    raise RuntimeError("connection reset after the request was sent")


crash_refunds = exactcall.Budget("test-crash-refunds", limit=5000, measure="amount")


@exactcall.tool(budgets=[crash_refunds], provider_idempotent=True, heartbeat_timeout=FAST)
def crash_refund(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Calls in flight on the killed worker are re-sent under their key: the bank dedupes."""
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


mt_refunds = exactcall.Budget("mt-refunds", limit=1000, measure="amount")


@exactcall.tool(budgets=[mt_refunds], provider_idempotent=True, heartbeat_timeout=FAST)
def mt_budgeted_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """tests/test_metrics.py: charges its amount to the namespace budget ``mt-refunds``."""
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


compact = exactcall.Budget("test-compact", limit=10)


@exactcall.tool(budgets=[compact], provider_idempotent=True, heartbeat_timeout=FAST)
def budget_compact(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


late = exactcall.Budget("test-late", limit=1000, measure="amount")


@exactcall.tool(budgets=[late], provider_idempotent=True, heartbeat_timeout=FAST)
def budget_late(bank: str, amount: int, to: str) -> dict[str, Any]:
    """tests/budget_v1.py's tool after the deploy that gave it a budget."""
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


LOAD_CALLS = int(os.environ.get("EXACTCALL_LOAD_CALLS", "100"))
"""Calls of tests/test_budgets.py's load test (500 for the issue's full figure: a bench run)."""
load = exactcall.Budget("test-load", limit=LOAD_CALLS * 4, measure="amount")


@exactcall.tool(budgets=[load], provider_idempotent=True, heartbeat_timeout=FAST)
def load_refund(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Calls of 10 against a limit of 4 per call: exactly 40% of them run."""
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


ahead = exactcall.Budget("test-ahead", limit=1000, measure="amount")


@exactcall.tool(budgets=[ahead], provider_idempotent=True, heartbeat_timeout=FAST)
def budget_ahead(bank: str, amount: int, to: str, fail: bool = False) -> dict[str, Any]:
    """Sequential calls of one run: the later ones draw from the run's allowance."""
    if fail:
        raise exactcall.NotExecuted("declined before sending", retry=False)
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


ahead_unknown = exactcall.Budget("test-ahead-unknown", limit=1000, measure="amount")


@exactcall.tool(budgets=[ahead_unknown], provider_idempotent=True, heartbeat_timeout=FAST)
def ahead_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post(bank, "/payments", {"amount": amount, "to": to}, exactcall.idempotency_headers())


@exactcall.tool(budgets=[ahead_unknown], heartbeat_timeout=FAST)
def ahead_lost(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Drawn from the run's allowance (the same ledger as ahead_pay); its answer is lost."""
    post(bank, "/payments", {"amount": amount, "to": to})
    raise RuntimeError("connection reset after the request was sent")
