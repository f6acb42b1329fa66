"""Small stdio MCP servers for the proxy's tests: ``python -m tests.mcp_proxy_servers KIND FILE``.

* ``effects FILE``: an MCP SDK v2 server whose tools append one line per real execution to
  FILE (the effect counter), so a test counts what really ran at the destination:
  ``append`` (a write), ``slow_append`` (a write that first writes ``FILE.started``, then sleeps,
  then appends), ``slow_save`` (the same, whose output schema is ``{"content": string}``),
  ``get_lines`` (a read by its name), ``tally`` (``readOnlyHint: true`` but a
  write-looking name), ``refuse`` (answers isError with ``_meta`` ``io.exactcall/not-executed``)
  ``fail_soft`` (answers isError without it), ``get_count`` (a read by its name),
  ``write_file`` (overwrites ``FILE.content``), ``set_logging`` (a toggle) and ``increment``
  (a counter without arguments). Each appends ``TOOL ARG KEY`` where KEY is the
  ``io.exactcall/idempotency-key`` it received in ``_meta`` (and answers with it, plus the
  ``_meta`` ``io.example/trace`` it got; over HTTP, `` header=V`` is added when the request
  had ``X-Exactcall-Test: V``). At start it writes its pid and its
  parent's (the proxy's) to ``FILE.pid``. ``effects FILE PORT`` serves the same tools over
  Streamable HTTP on ``http://127.0.0.1:PORT/mcp``.
* ``raw FILE``: no SDK; appends every line it receives to FILE exactly as the bytes came, and
  answers ``initialize``, ``tools/list`` and ``tools/call`` minimally; a line that is not JSON
  gets a line that is not JSON back, and a batch gets a batch back; a
  ``tools/call`` of ``hang`` is never answered.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

KEY_META = "io.exactcall/idempotency-key"


class Saved(BaseModel):
    content: str


def effects_server(path: Path) -> MCPServer:
    server = MCPServer("effects")

    def record(tool: str, arg: str, ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        key = meta.get(KEY_META) if isinstance(meta, dict) else getattr(meta, KEY_META, None)
        line = f"{tool} {arg} {key}"
        request = getattr(ctx.request_context, "request", None)  # over HTTP: the headers
        header = request.headers.get("x-exactcall-test") if request is not None else None
        if header:
            line += f" header={header}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        trace = meta.get("io.example/trace") if isinstance(meta, dict) else None
        return f"{line} trace={trace}"

    @server.tool()
    def append(line: str, ctx: Context) -> str:
        """Append a line (a write)."""
        return record("append", line, ctx)

    @server.tool()
    def slow_append(line: str, seconds: float, ctx: Context) -> str:
        """Mark the start, sleep, then append (a slow write)."""
        Path(f"{path}.started").write_text(line)
        time.sleep(seconds)
        return record("slow_append", line, ctx)

    @server.tool()
    def slow_save(line: str, seconds: float, ctx: Context) -> Saved:
        """As slow_append, with an output schema of its own: ``{"content": string}``."""
        Path(f"{path}.started").write_text(line)
        time.sleep(seconds)
        return Saved(content=record("slow_save", line, ctx))

    @server.tool()
    def get_lines(ctx: Context) -> str:
        """How many lines the file has (a read, by its name); counts its own runs too."""
        n = len(path.read_text().splitlines()) if path.exists() else 0
        record("get_lines", str(n), ctx)
        return str(n)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def tally(ctx: Context) -> str:
        """Says it is read-only (readOnlyHint), with a name that does not."""
        return record("tally", "-", ctx)

    @server.tool()
    def refuse(line: str, ctx: Context) -> CallToolResult:
        """An error that says the call did not happen."""
        record("refuse", line, ctx)
        return CallToolResult(
            content=[TextContent(type="text", text="quota exceeded, nothing done")],
            is_error=True,
            _meta={"io.exactcall/not-executed": True},
        )

    @server.tool()
    def fail_soft(line: str, ctx: Context) -> CallToolResult:
        """An error that does not say whether anything happened."""
        record("fail_soft", line, ctx)
        return CallToolResult(
            content=[TextContent(type="text", text="timeout talking to the ledger")],
            is_error=True,
        )

    @server.tool()
    def get_count(ctx: Context) -> str:
        """A read by its name, that the tests guard with --write/--dedupe."""
        return record("get_count", "-", ctx)

    @server.tool()
    def write_file(content: str, ctx: Context) -> str:
        """Overwrite FILE.content (a write whose last call decides what is on disk)."""
        Path(f"{path}.content").write_text(content)
        record("write_file", content, ctx)
        return f"Successfully wrote {content!r}"

    @server.tool()
    def set_logging(on: bool, ctx: Context) -> str:
        """A toggle: the last call's value is the state."""
        record("set_logging", "on" if on else "off", ctx)
        return f"logging is {'on' if on else 'off'}"

    @server.tool()
    def increment(ctx: Context) -> str:
        """A counter without arguments: every real call adds one."""
        record("increment", "-", ctx)
        n = sum(1 for ln in path.read_text().splitlines() if ln.startswith("increment "))
        return f"count is {n}"

    return server


def raw_server(path: Path) -> None:
    """Log every line as received; answer the few requests a proxy test needs."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        with path.open("ab") as f:
            f.write(line)
        try:
            msg = json.loads(line)
        except ValueError:
            out.write(b"this line is not JSON\n")
            out.flush()
            continue
        if isinstance(msg, list):
            answers = [_answer(m) for m in msg if isinstance(m, dict) and "id" in m]
            out.write(json.dumps(answers).encode() + b"\n")
        elif isinstance(msg, dict) and "id" in msg:
            answer = _answer(msg)
            if answer:
                out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


CAPABLE_TOOLS = {"roots": "pick_root", "sampling": "ask_model", "elicitation": "ask_user"}
_declared: set[str] = set()  # the client capabilities declared in initialize


def _answer(msg: dict[str, Any]) -> dict[str, Any]:
    method, rid = msg.get("method"), msg.get("id")
    params = msg.get("params") or {}
    if method == "initialize":
        _declared.update((params.get("capabilities") or {}).keys())
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"},
        }
    elif method == "tools/list":
        # like servers whose tools need the client's roots, sampling or elicitation, list
        # those only to a client that declared the capability in initialize
        names = ["poke"] + [CAPABLE_TOOLS[c] for c in CAPABLE_TOOLS if c in _declared]
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}
    elif method == "tools/call" and params.get("name") == "hang":
        return {}  # never answered: the tests cancel it
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": f"poked {params.get('arguments')}"}]}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no such method"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


if __name__ == "__main__":
    kind, file = sys.argv[1], Path(sys.argv[2])
    if kind == "raw":
        raw_server(file)
    else:
        # who we are, and who started us (the proxy): tests SIGKILL one or the other
        Path(f"{file}.pid").write_text(f"{os.getpid()} {os.getppid()}")
        if len(sys.argv) > 3:  # effects FILE PORT: over Streamable HTTP on 127.0.0.1:PORT/mcp
            effects_server(file).run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
        else:
            effects_server(file).run()
