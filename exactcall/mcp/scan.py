"""``exactcall mcp scan``: which tools of an MCP client's servers can hurt, and what the proxy
will do with each, before you use them.

Each stdio server of the given MCP client configs (Claude Desktop, Cursor, Claude Code
``.mcp.json``: all use ``{"mcpServers": {name: {command, args, env}}}``), or the one command
after ``--``, is started and sent only ``initialize`` and ``tools/list``; no tool is called.
The scan declares what a real client declares (roots, sampling, elicitation; it answers any
such request with an empty list or a polite refusal), so tools a server lists only for capable
clients are scanned too. A config it cannot use (unreadable, not JSON, no ``mcpServers``) is
reported and skipped.

Every tool gets, from the one classifier the proxy uses too (:mod:`exactcall.mcp._classify`):

* a **risk** (:func:`exactcall.mcp._classify.risk`): **high** (moves money, deletes, runs code
  or sends messages, by its name or description, or ``destructiveHint: true``), **low**
  (``readOnlyHint: true`` or a read-only name such as ``get_``/``list_``/``open_nodes``, with
  no sign of a write), **medium** (the rest). Evidence of a write in the name wins over a
  ``readOnlyHint``: ``delete_everything`` with ``readOnlyHint: true`` is high,
  ``update_ticket`` with it medium;
* what ``exactcall mcp proxy`` with the same ``--trusted`` / ``--read-only`` / ``--write`` /
  ``--approve`` flags would do with it (:meth:`exactcall.mcp._proxy_policy.Policy.decide`):
  ``pass`` (through, a read), ``guard`` (a write, run once) or ``approve`` (and wait for
  approval), and why. A ``readOnlyHint`` counts there only with ``--trusted``.

The exit code is 1 when a tool is at or above ``--fail-on`` (default high), 2 when nothing
could be scanned (or the flags contradict each other), else 0.
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.types import (
    INVALID_REQUEST,
    CreateMessageRequestParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    ListRootsResult,
)
from mcp.types import Tool as WireTool

from exactcall.mcp._classify import name_evidence, risk, words
from exactcall.mcp._proxy_policy import Policy

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
    "words",
]

LEVELS = ("low", "medium", "high")
ACTIONS = {"pass": "pass through", "guard": "guard as a write", "approve": "need approval"}
DEFAULT_TIMEOUT = 20.0


# -- classification ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Classification:
    """A tool's risk (``low``, ``medium``, ``high``) and the reasons, readable as they are; and
    what the proxy would do with it (``pass``, ``guard``, ``approve``) and why."""

    tool: str
    risk: str
    reasons: tuple[str, ...]
    annotations: dict[str, Any] = field(default_factory=dict)
    proxy: str = "guard"
    proxy_reason: str = "not known to be read-only"


def looks_read_only(name: str) -> bool:
    """The name rule: the first word is a read verb and nothing in the name is a write."""
    return name_evidence(name).read


def _hints(t: WireTool) -> dict[str, Any]:
    if t.annotations is None:
        return {}
    dumped = t.annotations.model_dump(by_alias=True, exclude_none=True)
    return {k: v for k, v in dumped.items() if k.endswith("Hint")}


def classify(t: WireTool, policy: Policy | None = None) -> Classification:
    """Class one tool: its risk, and what a proxy with ``policy`` (default: no flags) does.

    The policy sees the tool's annotations as the proxy would, from its ``tools/list`` entry.
    """
    if policy is None or t.name not in policy.annotations:
        policy = replace(policy or Policy(), annotations={})
        policy.learn({"tools": [_wire(t)]})
    level, reasons = risk(t.name, t.description or "", t.annotations)
    decision = policy.decide(t.name)
    return Classification(t.name, level, reasons, _hints(t), decision.action, decision.reason)


def _wire(t: WireTool) -> dict[str, Any]:
    return t.model_dump(by_alias=True, mode="json", exclude_none=True)


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
    error: str | None = None
    """Why this config (or server entry) cannot be used; it is reported and skipped."""


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
    try:
        return _parse_entry(name, spec, source)
    except ValueError as exc:
        return ServerEntry(str(name), source, error=str(exc))


def _parse_entry(name: str, spec: Any, source: str) -> ServerEntry:
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


async def scan_server(
    entry: ServerEntry, timeout: float = DEFAULT_TIMEOUT, policy: Policy | None = None
) -> ServerReport:
    """Start one stdio server, ``initialize`` + ``tools/list``, classify; never raises."""
    if entry.error is not None:
        return ServerReport(entry, "skipped", entry.error)
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
    return ServerReport(entry, tools=[classify(t, policy) for t in tools])


# What a real client declares, so servers list the tools they offer only to capable clients.
# No tool is called during a scan, so none of these should be asked; if one is, the answer
# gives nothing away: no roots, and a refusal to sample or elicit.
async def _no_roots(context: ClientRequestContext) -> ListRootsResult:
    return ListRootsResult(roots=[])


async def _no_sampling(
    context: ClientRequestContext, params: CreateMessageRequestParams
) -> ErrorData:
    return ErrorData(code=INVALID_REQUEST, message="exactcall mcp scan does not sample")


async def _decline(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="decline")


async def _list_tools(params: StdioServerParameters, errlog: Any) -> list[WireTool]:
    found: list[WireTool] = []
    client = Client(
        stdio_client(params, errlog=errlog),
        mode="legacy",
        cache=None,
        list_roots_callback=_no_roots,
        sampling_callback=_no_sampling,
        elicitation_callback=_decline,
    )
    async with client as c:
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
        policy = _policy(ns)
        entries = _entries(ns)
    except ValueError as exc:
        print(f"exactcall mcp scan: {exc}", file=sys.stderr)
        return 2
    limit = getattr(ns, "timeout", None)
    timeout = limit.total_seconds() if limit is not None else DEFAULT_TIMEOUT
    reports = asyncio.run(_scan_all(entries, timeout, policy))
    code = exit_code(reports, ns.fail_on)
    if ns.json:
        print(json.dumps(to_json(reports, ns.fail_on, code), indent=2))
    else:
        print(render(reports, ns.fail_on, code))
    return code


async def _scan_all(
    entries: Sequence[ServerEntry], timeout: float, policy: Policy | None = None
) -> list[ServerReport]:
    return list(await asyncio.gather(*(scan_server(e, timeout, policy) for e in entries)))


def _policy(ns: argparse.Namespace) -> Policy:
    """The proxy's flags, as given to the scan; contradicting flags are a ValueError."""
    policy, errors = Policy.from_flags(ns)
    if errors:
        raise ValueError("; ".join(errors))
    return policy


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
        try:
            entries += load_config(p)
        except ValueError as exc:  # reported and skipped: the other configs still count
            entries.append(ServerEntry(p.name, str(p), error=f"config skipped: {exc}"))
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
        head = f"{r.entry.name}  ({where}; from {r.entry.source})" if where else r.entry.source
        lines.append(head)
        if r.status != "scanned":
            lines += [f"  {r.status}: {r.error}", ""]
            continue
        width = max([4, *(len(c.tool) for c in r.tools)])
        lines.append(f"  {'RISK':<6}  {'TOOL':<{width}}  {'PROXY':<16}  WHY")
        for c in sorted(r.tools, key=lambda c: (-LEVELS.index(c.risk), c.tool)):
            proxy = ACTIONS.get(c.proxy, c.proxy)
            why = "; ".join([*c.reasons, *_proxy_note(c)])
            lines.append(f"  {c.risk:<6}  {c.tool:<{width}}  {proxy:<16}  {why}")
        lines.append("")
    counts = {lvl: sum(c.risk == lvl for r in reports for c in r.tools) for lvl in LEVELS}
    failed = sum(r.status != "scanned" for r in reports)
    summary = ", ".join(f"{n} {lvl}" for lvl, n in reversed(counts.items()))
    lines.append(f"{summary}; {failed} server(s) not scanned; --fail-on {fail_on}: exit {code}")
    return "\n".join(lines)


def _proxy_note(c: Classification) -> list[str]:
    """The proxy's reason, unless the risk's reasons already say it (the same name rule)."""
    r = c.proxy_reason
    if r.startswith("not read-only: the name has") and any(
        x.startswith("name matches") for x in c.reasons
    ):
        return []
    if r.startswith("the name starts with") and any(
        x.startswith("name starts with") for x in c.reasons
    ):
        return []
    return [f"proxy: {r}"]


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
