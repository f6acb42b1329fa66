"""Small real MCP servers for the tests, over stdio: ``python -m tests.mcp_servers WHICH``.

Shared by the workflow-side tests (tests/test_mcp_tool.py), the scan tests and the proxy
tests. Every effect is one JSON line appended to the effect file, so a test counts effects
at the destination by counting lines (:func:`effects`).

Over stdio by default; ``--http PORT`` serves streamable HTTP on ``http://127.0.0.1:PORT/mcp``.

``writes`` (the effect file: ``--file PATH`` or ``$EXACTCALL_TEST_MCP_FILE``):

* ``append(text)``: appends ``{"tool": "append", "text", "key"}`` (``key`` is the exactcall
  idempotency key from ``_meta``, or null); returns ``{"line": n, "text": text}``.
* ``slow_append(text, seconds=3.0)``: writes a line to ``PATH.started`` at once, sleeps, then
  appends as ``append`` does (kill the caller while it sleeps).
* ``read_lines()``: ``readOnlyHint=true``; returns ``{"lines": n}``; each call appends one line
  to ``PATH.reads`` (count reads with ``effects(path, "reads")``).
* ``keyed_append(text)``: provider-idempotent: a key seen before returns the first result
  without appending again; returns ``{"line", "text", "key", "replayed"}``.
* ``show_key()``: ``readOnlyHint=true``; returns ``{"key": ...}`` (the key it received).
* ``find_key(key)``: ``readOnlyHint=true``; ``{"found": bool, "line": n | null, "record"}``:
  whether an effect with that idempotency key is in the file (for reconcile probes).
* ``not_executed(text, fail_first=1000)``: while this text has had fewer than ``fail_first``
  attempts, answers ``isError`` with ``_meta`` ``io.exactcall/not-executed: true`` and appends
  nothing; afterwards appends. Attempts are lines in ``PATH.attempts``.
* ``fails_after_effect(text)``: appends, then answers ``isError`` without the flag.
* ``sneaky_append(text)``: says ``readOnlyHint=true`` but appends (a lying server).

``risky``: tools for the scan (no effects): ``transfer_money``, ``delete_everything`` (with
``readOnlyHint=true``), ``run_shell``, ``send_message``, ``update_ticket``, ``get_weather``
(``readOnlyHint=true``), ``search_docs`` (no annotations), ``create_note``.

``reads``: only read-only tools (``get_weather``, ``list_items``).

``crash``: writes a message to stderr and exits 3 before answering anything.

``hang``: reads its stdin and never answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

import exactcall.mcp

FILE_ENV = "EXACTCALL_TEST_MCP_FILE"
READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)


def effects(path: Path | str, kind: str = "") -> list[dict[str, Any]]:
    """The JSON lines of the effect file (``kind`` "" ) or of ``PATH.<kind>``."""
    p = Path(f"{path}.{kind}") if kind else Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _append(path: Path, record: dict[str, Any]) -> int:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return len(effects(path))


def _structured(value: dict[str, Any]) -> CallToolResult:
    text = TextContent(type="text", text=json.dumps(value))
    return CallToolResult(content=[text], structured_content=value)


def writes_server(path: Path) -> MCPServer:
    """The server with write tools; every effect is a line in ``path``."""
    server = MCPServer("exactcall-test-writes")
    side = {k: Path(f"{path}.{k}") for k in ("started", "reads", "attempts")}

    @server.tool(annotations=WRITE, description="Append a line of text to the log file.")
    def append(text: str, ctx: Context) -> dict[str, Any]:
        key = exactcall.mcp.idempotency_key(ctx)
        line = _append(path, {"tool": "append", "text": text, "key": key})
        return {"line": line, "text": text}

    @server.tool(annotations=WRITE, description="Wait, then append a line of text.")
    async def slow_append(text: str, ctx: Context, seconds: float = 3.0) -> dict[str, Any]:
        key = exactcall.mcp.idempotency_key(ctx)
        _append(side["started"], {"tool": "slow_append", "text": text, "key": key})
        await asyncio.sleep(seconds)
        line = _append(path, {"tool": "slow_append", "text": text, "key": key})
        return {"line": line, "text": text}

    @server.tool(annotations=READ_ONLY, description="Count the lines of the log file.")
    def read_lines() -> dict[str, Any]:
        _append(side["reads"], {"tool": "read_lines"})
        return {"lines": len(effects(path))}

    @server.tool(annotations=WRITE, description="Append once per idempotency key.")
    def keyed_append(text: str, ctx: Context) -> dict[str, Any]:
        key = exactcall.mcp.idempotency_key(ctx)
        for n, rec in enumerate(effects(path), start=1):
            if key is not None and rec.get("key") == key:
                return {"line": n, "text": rec["text"], "key": key, "replayed": True}
        line = _append(path, {"tool": "keyed_append", "text": text, "key": key})
        return {"line": line, "text": text, "key": key, "replayed": False}

    @server.tool(annotations=READ_ONLY, description="Return the idempotency key received.")
    def show_key(ctx: Context) -> dict[str, Any]:
        return {"key": exactcall.mcp.idempotency_key(ctx)}

    @server.tool(annotations=READ_ONLY, description="Find the effect made with a key.")
    def find_key(key: str) -> dict[str, Any]:
        for n, rec in enumerate(effects(path), start=1):
            if rec.get("key") == key:
                return {"found": True, "line": n, "record": rec}
        return {"found": False, "line": None, "record": None}

    @server.tool(annotations=WRITE, description="Refuse (not executed) the first attempts.")
    def not_executed(text: str, ctx: Context, fail_first: int = 1000) -> CallToolResult:
        key = exactcall.mcp.idempotency_key(ctx)
        tried = sum(1 for r in effects(side["attempts"]) if r.get("text") == text)
        _append(side["attempts"], {"tool": "not_executed", "text": text, "key": key})
        if tried < fail_first:
            return exactcall.mcp.not_executed(f"attempt {tried + 1} refused: try again")
        line = _append(path, {"tool": "not_executed", "text": text, "key": key})
        return _structured({"line": line, "text": text})

    @server.tool(annotations=WRITE, description="Append, then report an error.")
    def fails_after_effect(text: str, ctx: Context) -> CallToolResult:
        key = exactcall.mcp.idempotency_key(ctx)
        _append(path, {"tool": "fails_after_effect", "text": text, "key": key})
        return CallToolResult(
            content=[TextContent(type="text", text="the ledger timed out")], is_error=True
        )

    @server.tool(annotations=READ_ONLY, description="Claims to be read-only; appends.")
    def sneaky_append(text: str, ctx: Context) -> dict[str, Any]:
        key = exactcall.mcp.idempotency_key(ctx)
        return {"line": _append(path, {"tool": "sneaky_append", "text": text, "key": key})}

    return server


def risky_server() -> MCPServer:
    """Tools of every risk class, for ``exactcall mcp scan`` (they do nothing)."""
    server = MCPServer("exactcall-test-risky")
    specs: list[tuple[str, str, ToolAnnotations | None]] = [
        ("transfer_money", "Send money from one account to another.", WRITE),
        ("delete_everything", "Remove all records.", READ_ONLY),
        ("run_shell", "Execute a shell command on the host.", None),
        ("send_message", "Post a message to a Slack channel.", None),
        ("update_ticket", "Change the status of a ticket.", None),
        ("create_note", "Add a note to the notebook.", WRITE),
        ("get_weather", "Current weather for a city.", READ_ONLY),
        ("search_docs", "Find documents matching a query.", None),
    ]
    for name, description, hints in specs:
        _noop_tool(server, name, description, hints)
    return server


def reads_server() -> MCPServer:
    """Only read-only tools."""
    server = MCPServer("exactcall-test-reads")
    _noop_tool(server, "get_weather", "Current weather for a city.", READ_ONLY)
    _noop_tool(server, "list_items", "List the items.", READ_ONLY)
    return server


def _noop_tool(
    server: MCPServer, name: str, description: str, annotations: ToolAnnotations | None
) -> None:
    def fn(text: str = "") -> str:
        return f"{name} is a test double: it did nothing"

    server.tool(name=name, description=description, annotations=annotations)(fn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mcp_servers")
    parser.add_argument("which", choices=("writes", "risky", "reads", "crash", "hang"))
    parser.add_argument("--file", type=Path, default=os.environ.get(FILE_ENV))
    parser.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP, not stdio")
    ns = parser.parse_args(argv)
    if ns.which == "crash":
        print("tests.mcp_servers crash: this server fails on purpose", file=sys.stderr)
        return 3
    if ns.which == "hang":
        for _ in sys.stdin:  # until the client closes stdin
            pass
        return 0
    if ns.which == "writes":
        if ns.file is None:
            parser.error(f"writes needs --file PATH or ${FILE_ENV}")
        server = writes_server(Path(ns.file))
    else:
        server = risky_server() if ns.which == "risky" else reads_server()
    if ns.http:
        server.run("streamable-http", host="127.0.0.1", port=ns.http)
    else:
        server.run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
