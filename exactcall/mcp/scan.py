"""``exactcall mcp scan``: which tools of an MCP client's servers can hurt, before you use them.

Each stdio server of the given MCP client configs (Claude Desktop, Cursor, Claude Code
``.mcp.json``: all use ``{"mcpServers": {name: {command, args, env}}}``), or the one command
after ``--``, is started and sent only ``initialize`` and ``tools/list``; no tool is called.
Every tool is classed by :func:`classify`:

* **high**: moves money, deletes, runs code or sends messages (by its name or description),
  or says ``destructiveHint: true``;
* **low**: read-only: ``readOnlyHint: true``, or a read-only name (``get_``, ``list_``,
  ``search_``, ...), with no sign of a write;
* **medium**: every other tool (a write, or nothing says it is not).

Evidence of a write in the name or description wins over a ``readOnlyHint``: the MCP spec
says hints from untrusted servers must not decide anything, so ``delete_everything`` with
``readOnlyHint: true`` is high, and ``update_ticket`` with it is medium. The exit code is 1 when
a tool is at or above ``--fail-on`` (default high), 2 when no server could be scanned, else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import Tool as WireTool

__all__ = [
    "Classification",
    "ServerEntry",
    "ServerReport",
    "classify",
    "default_config_paths",
    "load_config",
    "looks_read_only",
    "run_scan",
    "scan_server",
]

LEVELS = ("low", "medium", "high")
DEFAULT_TIMEOUT = 20.0

# (verbs, nouns, what they mean): a verb anywhere in the name is high risk; a noun is, unless
# the name starts with a read verb (``send_message`` is high, ``read_message`` is not)
HIGH_RISK: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (
        ("transfer", "pay", "refund", "charge", "withdraw", "wire", "purchase", "buy"),
        ("payment", "payout", "money", "funds", "invoice"),
        "moves money",
    ),
    (
        ("delete", "remove", "destroy", "drop", "purge", "wipe", "erase", "truncate", "rm",
         "unlink", "revoke"),
        (),
        "deletes",
    ),
    (
        ("exec", "execute", "run", "eval", "spawn"),
        ("shell", "bash", "command", "script", "terminal", "subprocess", "sql", "code"),
        "runs code",
    ),
    (
        ("send", "post", "publish", "tweet", "notify", "reply", "dm", "broadcast", "email"),
        ("message", "mail", "sms", "notification"),
        "sends messages",
    ),
)  # fmt: skip
WRITE_WORDS = (
    "create", "add", "insert", "update", "set", "write", "edit", "modify", "change", "put",
    "patch", "upload", "save", "move", "rename", "assign", "close", "open", "merge",
    "commit", "push", "deploy", "install", "approve", "cancel", "book", "schedule", "invite",
    "archive", "restore", "enable", "disable", "start", "stop", "restart", "kill", "lock",
    "append", "submit", "register", "grant", "apply", "replace", "clear", "reset", "mark",
    "upsert", "increment", "import", "sync",
)  # fmt: skip
READ_WORDS = (
    "get", "list", "read", "search", "find", "fetch", "query", "describe", "show", "view",
    "lookup", "count", "check", "status", "info", "inspect", "browse", "preview", "whoami",
)  # fmt: skip
_DESCRIPTION_HIGH = re.compile(
    r"\b(send(s|ing)? (money|funds|payments?|e-?mails?|messages?)|transfers? (money|funds)"
    r"|delet(e|es|ing)|execut(e|es|ing) (code|commands?|scripts?|shell)"
    r"|shell commands?|arbitrary code|charges? (a|the) (card|customer))\b",
    re.IGNORECASE,
)


# -- classification ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Classification:
    """A tool's risk (``low``, ``medium``, ``high``) and the reasons, readable as they are."""

    tool: str
    risk: str
    reasons: tuple[str, ...]
    annotations: dict[str, Any] = field(default_factory=dict)


def words(name: str) -> list[str]:
    """``sendSlackMessage`` / ``send-slack.message`` -> ``["send", "slack", "message"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def looks_read_only(name: str) -> bool:
    """The name heuristic: the first word is a read verb and no word is a write word."""
    ws = words(name)
    return bool(ws) and ws[0] in READ_WORDS and _write_evidence(ws) is None


def _write_evidence(ws: Sequence[str]) -> str | None:
    for w in ws:
        if w in WRITE_WORDS or any(w in verbs for verbs, _, _ in HIGH_RISK):
            return w
    return None


def _high_evidence(name: str, description: str) -> list[str]:
    ws = words(name)
    reads = bool(ws) and ws[0] in READ_WORDS
    found: list[str] = []
    for verbs, nouns, meaning in HIGH_RISK:
        hit = next((w for w in ws if w in verbs or (w in nouns and not reads)), None)
        if hit is not None:
            found.append(f"name matches {hit!r} ({meaning})")
    m = _DESCRIPTION_HIGH.search(description or "")
    if m:
        found.append(f"description says {m.group(0)!r}")
    return found


def _annotations(t: WireTool) -> dict[str, Any]:
    if t.annotations is None:
        return {}
    dumped = t.annotations.model_dump(by_alias=True, exclude_none=True)
    return {k: v for k, v in dumped.items() if k.endswith("Hint")}


def classify(t: WireTool) -> Classification:
    """Class one tool from its annotations, name and description (see the module doc)."""
    hints = _annotations(t)
    read_hint = hints.get("readOnlyHint") is True
    high = _high_evidence(t.name, t.description or "")
    if hints.get("destructiveHint") is True and not read_hint:
        high.append("destructiveHint=true")
    if high:
        if read_hint:
            high.append("readOnlyHint=true ignored: high-risk evidence wins over a hint")
        return Classification(t.name, "high", tuple(high), hints)
    write = _write_evidence(words(t.name))
    if read_hint:
        if write is not None:
            why = f"name matches {write!r} (a write) despite readOnlyHint=true"
            return Classification(t.name, "medium", (why,), hints)
        return Classification(t.name, "low", ("readOnlyHint=true",), hints)
    if write is None and looks_read_only(t.name):
        why = f"name starts with {words(t.name)[0]!r} (read-only by name; no readOnlyHint)"
        return Classification(t.name, "low", (why,), hints)
    reasons = [f"name matches {write!r} (a write)" if write else "not marked readOnlyHint"]
    if hints.get("idempotentHint") is True:
        reasons.append("idempotentHint=true")
    return Classification(t.name, "medium", tuple(reasons), hints)


# -- configs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerEntry:
    """One server of a client config (or of the command after ``--``)."""

    name: str
    source: str
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None


def default_config_paths() -> list[Path]:
    """Claude Desktop, Cursor (user and project), Claude Code (project and user)."""
    home, cwd = Path.home(), Path.cwd()
    paths = [
        home / ".config" / "Claude" / "claude_desktop_config.json",
        home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json",
    ]
    if os.environ.get("APPDATA"):
        paths.append(Path(os.environ["APPDATA"]) / "Claude" / "claude_desktop_config.json")
    paths += [home / ".cursor" / "mcp.json", cwd / ".cursor" / "mcp.json", cwd / ".mcp.json"]
    paths.append(home / ".claude.json")
    return paths


def load_config(path: Path) -> list[ServerEntry]:
    """The servers of one MCP client config file; ValueError says what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON MCP config ({exc})") from exc
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f'{path}: no "mcpServers" object (the Claude/Cursor config format)')
    return [_entry(name, spec, str(path)) for name, spec in servers.items()]


def _entry(name: str, spec: Any, source: str) -> ServerEntry:
    if not isinstance(spec, dict):
        raise ValueError(f"{source}: server {name!r} is not an object")
    kind = spec.get("type", "stdio")
    if spec.get("url") or kind in ("http", "sse", "streamable-http"):
        return ServerEntry(name, source, url=str(spec.get("url", "")) or "(no url)")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError(f'{source}: server {name!r} has no "command" (a string)')
    args = [_expand(str(a)) for a in spec.get("args", [])]
    env = {str(k): _expand(str(v)) for k, v in (spec.get("env") or {}).items()}
    cwd = spec.get("cwd")
    return ServerEntry(name, source, (_expand(command), *args), env, cwd and _expand(cwd))


def _expand(text: str) -> str:
    """``${VAR}`` and ``${VAR:-default}`` (Claude Code's syntax), from the environment."""

    def one(m: re.Match[str]) -> str:
        return os.environ.get(m.group(1), m.group(3) or "")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", one, text)


# -- scanning ----------------------------------------------------------------------------------
@dataclass
class ServerReport:
    entry: ServerEntry
    status: str = "scanned"  # scanned | failed | skipped
    error: str | None = None
    tools: list[Classification] = field(default_factory=list)

    def worst(self) -> str | None:
        return max((c.risk for c in self.tools), key=LEVELS.index, default=None)


async def scan_server(entry: ServerEntry, timeout: float = DEFAULT_TIMEOUT) -> ServerReport:
    """Start one stdio server, ``initialize`` + ``tools/list``, classify; never raises."""
    if entry.url is not None:
        return ServerReport(entry, "skipped", f"not scanned: http server {entry.url}")
    params = StdioServerParameters(
        command=entry.command[0], args=list(entry.command[1:]), env=entry.env, cwd=entry.cwd
    )
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            tools = await asyncio.wait_for(_list_tools(params, errlog), timeout)
        except Exception as exc:
            return ServerReport(entry, "failed", _failure(exc, errlog, timeout))
    return ServerReport(entry, tools=[classify(t) for t in tools])


async def _list_tools(params: StdioServerParameters, errlog: Any) -> list[WireTool]:
    found: list[WireTool] = []
    async with Client(stdio_client(params, errlog=errlog), mode="legacy", cache=None) as c:
        cursor: str | None = None
        while True:
            page = await c.list_tools(cursor=cursor)
            found += page.tools
            cursor = page.next_cursor
            if not cursor:
                return found


def _failure(exc: BaseException, errlog: Any, timeout: float) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]  # the task group's first real error
    if isinstance(exc, TimeoutError):
        what = f"no answer to initialize/tools/list within {timeout:g} s"
    elif isinstance(exc, OSError):
        what = f"failed to start: {exc}"
    else:
        what = f"failed to start or answer: {type(exc).__name__}: {exc}"
    errlog.flush()
    errlog.seek(0)
    tail = [line.strip() for line in errlog.read().splitlines() if line.strip()][-3:]
    return what + (f" (stderr: {' | '.join(tail)})" if tail else "")


# -- the command -------------------------------------------------------------------------------
def run_scan(ns: argparse.Namespace) -> int:
    """``exactcall mcp scan``: print the table (or JSON); the exit code by ``--fail-on``."""
    try:
        entries = _entries(ns)
    except ValueError as exc:
        print(f"exactcall mcp scan: {exc}", file=sys.stderr)
        return 2
    limit = getattr(ns, "timeout", None)
    timeout = limit.total_seconds() if limit is not None else DEFAULT_TIMEOUT
    reports = asyncio.run(_scan_all(entries, timeout))
    code = exit_code(reports, ns.fail_on)
    if ns.json:
        print(json.dumps(to_json(reports, ns.fail_on, code), indent=2))
    else:
        print(render(reports, ns.fail_on, code))
    return code


async def _scan_all(entries: Sequence[ServerEntry], timeout: float) -> list[ServerReport]:
    return list(await asyncio.gather(*(scan_server(e, timeout) for e in entries)))


def _entries(ns: argparse.Namespace) -> list[ServerEntry]:
    command = list(ns.server_command or [])
    if command:
        name = next((a for a in reversed(command) if not a.startswith("-")), command[0])
        return [ServerEntry(Path(name).name, "command line", tuple(command))]
    paths = list(ns.config) or [p for p in default_config_paths() if p.is_file()]
    if not paths:
        looked = ", ".join(str(p) for p in default_config_paths())
        raise ValueError(
            f"no MCP client config found (looked in: {looked}); pass --config FILE or -- COMMAND..."
        )
    entries: list[ServerEntry] = []
    for p in paths:
        if not p.is_file():
            raise ValueError(f"--config {p}: no such file")
        entries += load_config(p)
    if not entries:
        raise ValueError(f"no MCP servers in {', '.join(map(str, paths))}")
    return entries


def exit_code(reports: Sequence[ServerReport], fail_on: str) -> int:
    """1 when a tool is at or above ``fail_on``; 2 when nothing could be scanned; else 0."""
    if not any(r.status == "scanned" for r in reports):
        return 2
    if fail_on == "none":
        return 0
    bar = LEVELS.index(fail_on)
    worst = [r.worst() for r in reports if r.worst() is not None]
    return 1 if any(LEVELS.index(w) >= bar for w in worst if w) else 0


def render(reports: Sequence[ServerReport], fail_on: str, code: int) -> str:
    lines: list[str] = []
    for r in reports:
        where = r.entry.url or " ".join(r.entry.command)
        lines.append(f"{r.entry.name}  ({where}; from {r.entry.source})")
        if r.status != "scanned":
            lines += [f"  {r.status}: {r.error}", ""]
            continue
        width = max([4, *(len(c.tool) for c in r.tools)])
        lines.append(f"  {'RISK':<6}  {'TOOL':<{width}}  WHY")
        for c in sorted(r.tools, key=lambda c: (-LEVELS.index(c.risk), c.tool)):
            lines.append(f"  {c.risk:<6}  {c.tool:<{width}}  {'; '.join(c.reasons)}")
        lines.append("")
    counts = {lvl: sum(c.risk == lvl for r in reports for c in r.tools) for lvl in LEVELS}
    failed = sum(r.status != "scanned" for r in reports)
    summary = ", ".join(f"{n} {lvl}" for lvl, n in reversed(counts.items()))
    lines.append(f"{summary}; {failed} server(s) not scanned; --fail-on {fail_on}: exit {code}")
    return "\n".join(lines)


def to_json(reports: Sequence[ServerReport], fail_on: str, code: int) -> dict[str, Any]:
    return {
        "fail_on": fail_on,
        "exit_code": code,
        "servers": [_server_json(r) for r in reports],
    }


def _server_json(r: ServerReport) -> dict[str, Any]:
    e = r.entry
    out: dict[str, Any] = {"name": e.name, "source": e.source, "status": r.status}
    out["url" if e.url is not None else "command"] = e.url if e.url is not None else list(e.command)
    if r.error:
        out["error"] = r.error
    out["tools"] = [{**asdict(c), "reasons": list(c.reasons)} for c in r.tools]
    return out
