"""The ``_meta`` conventions of exactcall for MCP, and the key a server reads from them
(re-exported by ``exactcall.mcp``; its submodules import them from here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEDUPLICATED_META", "KEY_META", "NOT_EXECUTED_META", "idempotency_key"]

KEY_META = "io.exactcall/idempotency-key"
"""``_meta`` name of the idempotency key on a ``tools/call`` request."""
NOT_EXECUTED_META = "io.exactcall/not-executed"
"""``_meta`` name, on an ``isError`` result, of ``true``: the call did not happen."""
DEDUPLICATED_META = "io.exactcall/deduplicated"
"""``_meta`` name, on a result, of ``true``: a recorded result given again (the proxy)."""


def idempotency_key(ctx: Any) -> str | None:
    """The exactcall idempotency key of the MCP request being served, or None.

    ``ctx`` is what an MCP server's tool gets: an ``MCPServer`` ``Context``, a low-level
    ``ServerRequestContext``, or the request's ``_meta`` mapping itself. The same logical
    call always carries the same key (retries, crashed workers, replays), so a server that
    performs each key at most once is idempotent for exactcall.
    """
    meta = _request_meta(ctx)
    if meta is None:
        return None
    value = meta.get(KEY_META)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"_meta {KEY_META!r} must be a non-empty string, got {value!r}: the client sent "
            "a malformed idempotency key"
        )
    return value


def _request_meta(ctx: Any) -> Mapping[str, Any] | None:
    if ctx is None or isinstance(ctx, Mapping):
        return ctx
    request_context = getattr(ctx, "request_context", None)
    if request_context is not None and not isinstance(ctx, Mapping):
        ctx = request_context  # MCPServer Context -> its ServerRequestContext
    if hasattr(ctx, "meta"):
        meta = ctx.meta
        return meta if meta is None or isinstance(meta, Mapping) else dict(meta)
    raise TypeError(
        f"exactcall.mcp.idempotency_key() takes an MCP tool's Context, a request context or "
        f"the request's _meta mapping, not {type(ctx).__name__}"
    )
