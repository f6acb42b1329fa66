"""The MCP server of ``bench/mcp_proxy.py``: ``python bench/_mcp_server.py EFFECTS_FILE [PORT]``
(stdio; with PORT, Streamable HTTP on ``http://127.0.0.1:PORT/mcp``).

``append(text)`` (a write: no read-only hint) appends one JSON line ``{"text", "key"}`` to the
effects file (``key`` is the exactcall idempotency key from ``_meta``, or null) and returns
``{"line": n}``; ``count()`` (``readOnlyHint``) returns ``{"lines": n}``. The bench counts the
lines at the end: one per write, none twice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

import exactcall.mcp


def main() -> None:
    path = Path(sys.argv[1])
    lines = len(path.read_text().splitlines()) if path.exists() else 0
    out = path.open("a", encoding="utf-8")
    server = MCPServer("exactcall-bench")
    write = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)

    @server.tool(annotations=write, description="Append a line of text to the effects file.")
    def append(text: str, ctx: Context) -> dict[str, Any]:
        nonlocal lines
        out.write(json.dumps({"text": text, "key": exactcall.mcp.idempotency_key(ctx)}) + "\n")
        out.flush()
        lines += 1
        return {"line": lines}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True), description="Count lines.")
    def count() -> dict[str, Any]:
        return {"lines": lines}

    if len(sys.argv) > 2:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
