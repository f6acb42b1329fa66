"""Canonical identity of a call: the args hash and the derived key (pure, no server)."""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
import math
from datetime import timedelta
from typing import Any

import pydantic
import pytest
import rfc8785

import exactcall
from exactcall import InvalidCall


@exactcall.tool(name="canon_pay")
def canon_pay(amount: int, to: str, memo: str = "", *, meta: dict[str, Any] | None = None) -> None:
    """Only used for hashing."""


class Address(pydantic.BaseModel):
    city: str
    zip: str


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


@exactcall.tool(name="canon_ship")
def canon_ship(to: Address, lines: list[Line], total: decimal.Decimal) -> None:
    """Only used for hashing."""


def test_spelling_defaults_and_key_order_do_not_change_the_hash() -> None:
    h = exactcall.intent_hash(canon_pay, 10, "alice")
    assert h == exactcall.intent_hash(canon_pay, to="alice", amount=10)
    assert h == exactcall.intent_hash(canon_pay, 10, to="alice", memo="")
    assert h == exactcall.intent_hash("canon_pay", amount=10, to="alice")
    a = exactcall.intent_hash(canon_pay, 1, "x", meta={"a": 1, "b": [1, 2]})
    assert a == exactcall.intent_hash(canon_pay, 1, "x", meta={"b": [1, 2], "a": 1})


def test_different_values_change_the_hash() -> None:
    base = exactcall.intent_hash(canon_pay, 10, "alice")
    assert base != exactcall.intent_hash(canon_pay, 9999, "mallory")
    assert base != exactcall.intent_hash(canon_pay, 10, "alice", "memo")
    assert base != exactcall.intent_hash(canon_pay, 11, "alice")
    assert exactcall.intent_hash(canon_pay, 1, "x", meta={"a": 1}) != exactcall.intent_hash(
        canon_pay, 1, "x", meta={"a": "1"}
    )


def test_hash_formula_is_public_sha256_of_jcs() -> None:
    expected = hashlib.sha256(
        rfc8785.dumps(
            {"tool": "canon_pay", "args": {"amount": 10, "to": "alice", "memo": "", "meta": None}}
        )
    ).hexdigest()
    assert exactcall.intent_hash(canon_pay, 10, "alice") == expected


def test_rich_values_are_canonicalised_like_their_json() -> None:
    h1 = exactcall.intent_hash(
        canon_ship, Address(city="Oslo", zip="0150"), [Line("a", 2)], decimal.Decimal("12.50")
    )
    h2 = exactcall.intent_hash(
        canon_ship, {"zip": "0150", "city": "Oslo"}, [{"sku": "a", "qty": 2}], "12.50"
    )
    assert h1 == h2


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        ((math.nan, "a"), {}, "not a JSON number"),
        ((math.inf, "a"), {}, "not a JSON number"),
        ((1, b"raw"), {}, "raw bytes"),
        ((1, object()), {}, "not JSON-representable"),
        ((1, "a"), {"meta": {1: "x"}}, "not a string"),
        ((2**60, "a"), {}, "2**53"),
        ((1,), {}, "missing a required argument"),
        ((1, "a"), {"nope": 1}, "unexpected keyword"),
        (("ten", "a"), {}, "does not fit its annotation"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(
    args: tuple[Any, ...], kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidCall) as err:
        exactcall.intent_hash(canon_pay, *args, **kwargs)
    assert needle in err.value.message
    assert err.value.code == "InvalidCall"


def test_unknown_tool_and_non_tool() -> None:
    with pytest.raises(exactcall.UnknownTool, match="unknown tool 'nope'"):
        exactcall.intent_hash("nope", 1)
    with pytest.raises(exactcall.UnknownTool, match="not an exactcall tool"):
        exactcall.intent_hash(len, 1)  # type: ignore[arg-type]


def test_size_limit() -> None:
    @exactcall.tool(name="canon_small", max_args_bytes=64)
    def small(text: str) -> None: ...

    exactcall.intent_hash(small, "x" * 10)
    with pytest.raises(exactcall.ArgumentsTooLarge, match="over the limit of 64 bytes"):
        exactcall.intent_hash(small, "x" * 100)
    with pytest.raises(exactcall.ArgumentsTooLarge, match="262144"):
        exactcall.intent_hash(canon_pay, 1, "x" * (300 * 1024))


def test_idempotency_key_param_cannot_be_passed() -> None:
    @exactcall.tool(name="canon_keyed")
    def keyed(amount: int, *, idempotency_key: str) -> None: ...

    assert exactcall.intent_hash(keyed, 1) == exactcall.intent_hash(keyed, amount=1)
    with pytest.raises(InvalidCall, match="derived by exactcall"):
        exactcall.intent_hash(keyed, 1, idempotency_key="mine")


def test_derived_key_depends_on_namespace_workflow_step_tool_version_only() -> None:
    k = exactcall.derive_key("default", "wf-1", "pay#1", "pay", "1")
    assert k == exactcall.derive_key("default", "wf-1", "pay#1", "pay", "1")
    for other in [
        ("prod", "wf-1", "pay#1", "pay", "1"),
        ("default", "wf-2", "pay#1", "pay", "1"),
        ("default", "wf-1", "pay#2", "pay", "1"),
        ("default", "wf-1", "pay#1", "refund", "1"),
        ("default", "wf-1", "pay#1", "pay", "2"),
    ]:
        assert exactcall.derive_key(*other) != k
    assert (
        k
        == hashlib.sha256(
            rfc8785.dumps(["exactcall.key/v1", "default", "wf-1", "pay#1", "pay", "1"])
        ).hexdigest()
    )


def test_star_args_are_refused_at_declaration() -> None:
    with pytest.raises(TypeError, match=r"\*rest is not supported"):

        @exactcall.tool(name="canon_star")
        def star(*rest: int) -> None: ...


def test_an_unresolvable_annotation_is_logged_not_silently_dropped() -> None:
    from structlog.testing import capture_logs

    class Local(pydantic.BaseModel):  # not at module level: "Local" does not resolve
        n: int

    with capture_logs() as logs:

        @exactcall.tool(name="canon_unresolved")
        def unresolved(item: Local, count: int) -> None: ...

    [warning] = [e for e in logs if e["event"] == "tool.annotations_unresolved"]
    assert warning["log_level"] == "warning"
    assert warning["tool"] == "canon_unresolved"
    assert warning["annotation"] == "item"
    assert warning["annotation_text"] == "Local"
    assert "NameError" in warning["error"] and "Local" in warning["error"]
    assert "module level" in warning["fix"]
    # the tool still works, its arguments checked as JSON only (as before)
    assert unresolved.canonical_args([{"n": 1}, "2"], {}) == {"item": {"n": 1}, "count": "2"}


@pytest.mark.parametrize("late", [timedelta(seconds=-1), 5])
def test_a_late_commit_that_is_not_a_duration_is_refused_at_declaration(late: object) -> None:
    with pytest.raises(TypeError, match=r"late_commit=\.\.\.\) must be a timedelta >= 0"):

        @exactcall.tool(name="canon_late", late_commit=late)  # type: ignore[arg-type]
        def late_tool(amount: int) -> None: ...
