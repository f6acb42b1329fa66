"""Canonical JSON, the args hash and the derived idempotency key.

Pure and deterministic: safe inside workflows. The formulas are public so that other programs
can compute the same values:

* canonical JSON is RFC 8785 (JCS), produced by the maintained ``rfc8785`` package;
* ``args_hash = sha256_hex(JCS({"tool": <tool name>, "args": {<every parameter by name,
  defaults applied>}}))``;
* ``key = sha256_hex(JCS(["exactcall.key/v1", namespace, workflow_id, step, tool, version]))``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
import rfc8785

from exactcall._errors import InvalidCall
from exactcall._wire import KEY_SCHEME as KEY_SCHEME

__all__ = [
    "KEY_SCHEME",
    "JsonValue",
    "args_hash",
    "canonical_json",
    "derive_key",
    "to_json_value",
]

JsonValue = Any
"""A value made only of None, bool, int, finite float, str, list and str-keyed dict."""

_MAX_SAFE_INT = 2**53 - 1


def to_json_value(value: Any, where: str = "args") -> JsonValue:
    """Convert ``value`` to plain JSON data, or raise :class:`InvalidCall` saying where.

    Accepted besides plain JSON: tuples, pydantic models, dataclasses, Enum, Decimal,
    datetime/date/time and UUID (converted the way pydantic's JSON mode does). Refused:
    NaN and infinities, bytes, non-string dict keys, integers outside +/-(2**53-1) (they do
    not survive JSON in other languages) and any other object.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        if abs(value) > _MAX_SAFE_INT:
            raise _refuse(where, f"integer {value} is outside +/-(2**53-1); pass it as a string")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse(where, f"{value!r} is not a JSON number")
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raise _refuse(where, "raw bytes are not JSON; pass base64 or hex text instead")
    if isinstance(value, Mapping):
        return _mapping(value, where)
    if isinstance(value, Sequence):
        return [to_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return _rich(value, where)


def _mapping(value: Mapping[Any, Any], where: str) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise _refuse(where, f"dict key {k!r} is not a string")
        out[k] = to_json_value(v, f"{where}[{k!r}]")
    return out


def _rich(value: Any, where: str) -> JsonValue:
    if isinstance(value, pydantic.BaseModel):
        return to_json_value(value.model_dump(mode="python", by_alias=True), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json_value(
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, where
        )
    if isinstance(value, enum.Enum):
        return to_json_value(value.value, where)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _refuse(where, f"Decimal {value} is not a JSON number")
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise _refuse(where, f"an object of type {type(value).__name__} is not JSON-representable")


def _refuse(where: str, why: str) -> InvalidCall:
    return InvalidCall(
        f"{where}: {why}. exactcall only records arguments it can write as canonical JSON.",
        where=where,
    )


def canonical_json(value: JsonValue) -> bytes:
    """RFC 8785 canonical JSON of ``value`` (already plain JSON data)."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidCall(f"arguments cannot be written as canonical JSON: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def args_hash(tool: str, args: Mapping[str, JsonValue]) -> str:
    """sha256 of the canonical JSON of ``{"tool": tool, "args": args}``."""
    return sha256_hex(canonical_json({"tool": tool, "args": dict(args)}))


def derive_key(namespace: str, workflow_id: str, step: str, tool: str, version: str) -> str:
    """The idempotency key of one call. Never depends on the run id."""
    return sha256_hex(canonical_json([KEY_SCHEME, namespace, workflow_id, step, tool, version]))
