"""``exactcall mcp proxy`` and ``exactcall mcp scan``: the parsers, and dispatch.

The MCP SDK (the ``mcp`` extra) is imported only when one of them runs, by
``exactcall.mcp.proxy`` / ``exactcall.mcp.scan``; ``exactcall --help`` works without it.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "parse_duration", "parse_tool_window", "run"]

EXTRA_HINT = "pip install 'exactcall[mcp]'"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}
_SIZE = re.compile(r"^\s*(\d+)\s*(k|kb|kib|m|mb|mib)?\s*$", re.IGNORECASE)


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``10m``, ``1.5h``, ``500ms`` -> timedelta (argparse type)."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: use seconds (90, 90s), minutes (10m), hours (1h) or ms"
        )
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def parse_size(text: str) -> int:
    """``524288``, ``512KiB``, ``2MiB`` (K and M are 1024s) -> bytes (argparse type)."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (524288) or KiB/MiB (512KiB, 1MiB), over 0"
        )
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[unit]


def parse_tool_window(text: str) -> tuple[str, timedelta]:
    """``send_email=10m`` -> ``("send_email", 10 minutes)`` (argparse type)."""
    tool, sep, duration = text.rpartition("=")
    if not sep or not tool:
        raise argparse.ArgumentTypeError(f"{text!r}: use TOOL=DURATION, e.g. send_email=10m")
    window = parse_duration(duration)
    if window.total_seconds() <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the window must be positive")
    return tool, window


def header_arg(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (``${VAR}`` read from the environment) -> (name, value) (argparse)."""
    from exactcall.mcp._headers import parse_header

    try:
        return parse_header(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def upstream_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        help="proxy a Streamable HTTP MCP server (https://host/mcp) instead of a command",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        type=header_arg,
        metavar="NAME=VALUE",
        help="an HTTP header for --url, e.g. 'Authorization=Bearer ${TOKEN}' (${VAR} is read "
        "from the environment, so the secret is not in the process list)",
    )


def proxy_flags(p: argparse.ArgumentParser) -> None:
    """The flags `mcp proxy` and `mcp serve` share."""
    p.add_argument("--name", help="the upstream server's name (default: from its command or URL)")
    upstream_args(p)
    p.add_argument(
        "--retry-window",
        type=parse_duration,
        default=None,
        help="how long a write's outcome that reached no client (cancelled, disconnected, "
        "a proxy or client died) waits for the retry, which gets it without running it again "
        "(default 10m)",
    )
    p.add_argument(
        "--window",
        type=parse_duration,
        default=None,
        help=argparse.SUPPRESS,  # deprecated: --retry-window (and --dedupe-window TOOL=...)
    )
    p.add_argument(
        "--dedupe-window",
        action="append",
        default=[],
        metavar="TOOL=DURATION",
        type=parse_tool_window,
        help="identical calls of TOOL within DURATION run once, even deliberate repeats "
        "(e.g. send_email=10m); the model is told when a call was not run again",
    )
    p.add_argument("--read-only", action="append", default=[], metavar="TOOL")
    p.add_argument("--write", action="append", default=[], metavar="TOOL")
    p.add_argument("--dedupe", action="append", default=[], help=argparse.SUPPRESS)  # --write
    p.add_argument("--no-dedupe", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--approve", action="append", default=[], metavar="TOOL")
    p.add_argument(
        "--approval-wait",
        type=parse_duration,
        default=timedelta(seconds=60),
        help="how long a call waiting for approval holds the client before a tool error that "
        "says how to approve (default 60s)",
    )
    p.add_argument(
        "--trusted", action="store_true", help="trust the server's readOnlyHint annotations"
    )
    p.add_argument(
        "--max-args-bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="refuse a write whose canonical arguments are larger (default 256KiB; e.g. 1MiB; "
        "give every proxy of one --name the same)",
    )
    p.add_argument("--audit", type=Path, help="JSONL audit file (default: in the state folder)")
    p.add_argument(
        "--home",
        type=Path,
        help="the state folder (default $EXACTCALL_HOME, which MCP clients do not pass to a "
        "server unless its config's env has it): the embedded server's database, the audit",
    )


def add_parsers(sub: Any, connection_args: Callable[[argparse.ArgumentParser], None]) -> None:
    m = sub.add_parser(
        "mcp", help="MCP servers: a once-only proxy (stdio or HTTP), and a risk scan"
    )
    msub = m.add_subparsers(dest="mcp_command", required=True)

    p = msub.add_parser(
        "proxy",
        help="a stdio MCP server in front of another: its write calls happen once, on Temporal",
        description="Forwards everything between an MCP client and a stdio MCP server, except "
        "tools/call of write tools, which run as exactcall calls on Temporal (the embedded "
        "server when none is configured).",
    )
    proxy_flags(p)
    connection_args(p)
    p.add_argument("server_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    v = msub.add_parser(
        "serve",
        help="the proxy for HTTP clients: a Streamable HTTP endpoint in front of a server",
        description="Serves MCP over Streamable HTTP (http://HOST:PORT/mcp) in front of a stdio "
        "server (the command after --, one process per client session) or an HTTP one "
        "(--url), with the proxy's guarantees: write calls happen once, on Temporal.",
    )
    v.add_argument("--port", type=int, required=True, help="the port to listen on (0: any)")
    v.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    v.add_argument("--path", default="/mcp", help="the endpoint's path (default /mcp)")
    v.add_argument(
        "--session-idle",
        type=parse_duration,
        default=timedelta(minutes=30),
        help="end a session whose client sent nothing and held no stream for this long "
        "(its server stops; default 30m)",
    )
    v.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser Origin allowed besides local ones (e.g. https://app.example.com)",
    )
    proxy_flags(v)
    connection_args(v)
    v.add_argument("server_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    s = msub.add_parser(
        "scan",
        help="list each MCP server's tools by risk (calls no tool)",
        description="Starts each stdio server of an MCP client config (or the command after "
        "--), sends only initialize and tools/list, classes every tool high, medium or low, and "
        "says what exactcall mcp proxy with the same flags would do with it.",
    )
    s.add_argument("--config", type=Path, action="append", default=[], metavar="FILE")
    s.add_argument("--json", action="store_true")
    s.add_argument("--fail-on", choices=("high", "medium", "none"), default="high")
    s.add_argument(
        "--timeout",
        type=parse_duration,
        default=timedelta(seconds=20),
        help="how long each server has to start and list its tools (default 20s)",
    )
    # the proxy's own flags: the PROXY column says what a proxy given them does with each tool
    s.add_argument("--trusted", action="store_true", help="as the proxy's --trusted")
    s.add_argument("--read-only", action="append", default=[], metavar="TOOL")
    s.add_argument("--write", action="append", default=[], metavar="TOOL")
    s.add_argument("--approve", action="append", default=[], metavar="TOOL")
    s.add_argument(
        "--dedupe-window",
        action="append",
        default=[],
        metavar="TOOL=DURATION",
        type=parse_tool_window,
    )
    s.add_argument("server_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def run(ns: argparse.Namespace, connection: Any) -> int:
    command = list(ns.server_command or [])
    if command and command[0] == "--":
        command = command[1:]
    ns.server_command = command
    try:
        if ns.mcp_command in ("proxy", "serve"):
            from exactcall.mcp.proxy import run_proxy

            if bool(command) == bool(ns.url):
                print(
                    f"exactcall mcp {ns.mcp_command}: give the server command after --, or "
                    "--url URL (one of them)",
                    file=sys.stderr,
                )
                return 2
            result: Any = run_proxy(ns, connection)
        else:
            from exactcall.mcp.scan import run_scan

            result = run_scan(ns)
    except ImportError as exc:
        if "mcp" not in str(exc):
            raise
        hint = "" if EXTRA_HINT in str(exc) else f"; {EXTRA_HINT}"  # say it once
        print(f"exactcall mcp {ns.mcp_command}: {exc}{hint}", file=sys.stderr)
        return 2
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    return int(result)


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result
