"""exactcall for MCP: MCP tools as exactcall tools, the ``_meta`` conventions, and the key.

``exactcall.mcp.tool(server, name)`` defines an exactcall tool whose activity calls one tool
of an MCP server that the worker connects to (``exactcall.Plugin(mcp_servers={...})``). The
derived idempotency key travels in the request's ``_meta`` as ``io.exactcall/idempotency-key``;
a server reads it with :func:`idempotency_key`. A server says that a failed call did not
happen (so it may be retried) with ``_meta`` ``io.exactcall/not-executed: true`` on an
``isError`` result; any other error result is of unknown outcome.

Needs the ``mcp`` extra: ``pip install 'exactcall[mcp]'``.
"""

from __future__ import annotations

try:
    import mcp  # noqa: F401  (the extra: fail here, with the way to install it)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"exactcall.mcp needs the MCP SDK ({exc}): pip install 'exactcall[mcp]'"
    ) from exc

__all__ = [
    "DEDUPLICATED_META",
    "KEY_META",
    "NOT_EXECUTED_META",
    "McpServerSpec",
    "McpTool",
    "McpToolError",
    "call_tool",
    "idempotency_key",
    "not_executed",
    "parse_server_option",
    "server_spec",
    "tool",
]


from exactcall.mcp._meta import DEDUPLICATED_META, KEY_META, NOT_EXECUTED_META, idempotency_key
from exactcall.mcp._spec import McpServerSpec, parse_server_option, server_spec
from exactcall.mcp._tool import McpTool, McpToolError, call_tool, not_executed, tool
