"""What a running tool can ask about its own call: the key and the intent."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from exactcall._errors import ExactcallError
from exactcall._model import Intent

__all__ = ["current_intent", "idempotency_headers", "idempotency_key"]

_CURRENT: contextvars.ContextVar[Intent | None] = contextvars.ContextVar(
    "exactcall_intent", default=None
)


@contextmanager
def running(intent: Intent) -> Iterator[None]:
    token = _CURRENT.set(intent)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_intent() -> Intent:
    """The intent of the tool call running in this activity (sync or async tool)."""
    intent = _CURRENT.get()
    if intent is None:
        raise ExactcallError(
            "no exactcall tool call is running here: idempotency_key() and current_intent() "
            "work only inside a tool that runs through exactcall.call"
        )
    return intent


def idempotency_key() -> str:
    """The derived idempotency key of the running tool call; stable across every attempt."""
    return current_intent().key


def idempotency_headers() -> dict[str, str]:
    """``{"Idempotency-Key": <key>}``, ready for an HTTP client."""
    return {"Idempotency-Key": idempotency_key()}
