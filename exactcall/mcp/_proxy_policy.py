"""Which tools the proxy takes over (writes) and which pass through (reads); the audit file.

The order of the rules, first match wins:

1. ``--no-dedupe TOOL``: passes through, whatever else is known;
2. ``--dedupe TOOL`` or ``--approve TOOL``: a write;
3. ``--read-only TOOL``: passes through;
4. with ``--trusted``, the server's ``readOnlyHint: true`` (from ``tools/list``): passes
   through. Without it the hint decides nothing (the MCP spec: hints from untrusted servers
   must not drive decisions);
5. the name heuristic: a name whose first word is a read verb (``get``, ``list``, ``read``,
   ``search``, ``describe``, ``show``, ``find``, ``lookup``, ``view``, ``count``; words split
   at ``_ - . /`` and camelCase) passes through;
6. everything else is a write.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

__all__ = ["READ_VERBS", "Audit", "Policy", "first_word", "usage_errors"]

log = structlog.get_logger("exactcall")

READ_VERBS = frozenset(
    {"get", "list", "read", "search", "describe", "show", "find", "lookup", "view", "count"}
)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def first_word(name: str) -> str:
    """``get_user`` / ``getUser`` / ``get-user`` / ``files.get`` -> ``get`` / ``files``."""
    words = _WORDS.findall(name)
    return words[0].lower() if words else ""


def usage_errors(
    read_only: Iterable[str],
    dedupe: Iterable[str],
    no_dedupe: Iterable[str],
    approve: Iterable[str],
) -> list[str]:
    """Flags that contradict each other for one tool."""
    reads = set(read_only) | set(no_dedupe)
    writes = set(dedupe) | set(approve)
    errors = []
    for tool in sorted(reads & writes):
        errors.append(
            f"tool {tool!r} is given both as a read (--read-only/--no-dedupe) and as a write "
            "(--dedupe/--approve): keep one"
        )
    return errors


@dataclass
class Policy:
    """Decides, per tool name, whether a ``tools/call`` is a write the proxy takes over."""

    read_only: frozenset[str] = frozenset()
    dedupe: frozenset[str] = frozenset()
    no_dedupe: frozenset[str] = frozenset()
    approve: frozenset[str] = frozenset()
    trusted: bool = False
    annotations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tool name -> its ``annotations`` object, as last seen in a ``tools/list`` result."""

    def learn(self, tools_list_result: Any) -> None:
        """Read (never change) a ``tools/list`` result for the tools' annotations."""
        tools = tools_list_result.get("tools") if isinstance(tools_list_result, dict) else None
        for t in tools if isinstance(tools, list) else []:
            if isinstance(t, dict) and isinstance(t.get("name"), str):
                ann = t.get("annotations")
                self.annotations[t["name"]] = ann if isinstance(ann, dict) else {}

    def needs_listing(self, tool: str) -> bool:
        """Whether the tool's annotations would matter but are not known yet."""
        return self.trusted and tool not in self.annotations and self._flagged(tool) is None

    def is_write(self, tool: str) -> tuple[bool, str]:
        """(whether the proxy takes the call over, why)."""
        flagged = self._flagged(tool)
        if flagged is not None:
            return flagged
        if self.trusted and self.annotations.get(tool, {}).get("readOnlyHint") is True:
            return False, "readOnlyHint=true on a trusted server"
        verb = first_word(tool)
        if verb in READ_VERBS:
            return False, f"the name starts with {verb!r}"
        return True, "not known to be read-only"

    def _flagged(self, tool: str) -> tuple[bool, str] | None:
        if tool in self.no_dedupe:
            return False, "--no-dedupe"
        if tool in self.approve:
            return True, "--approve"
        if tool in self.dedupe:
            return True, "--dedupe"
        if tool in self.read_only:
            return False, "--read-only"
        return None


class Audit:
    """One JSON line per call: time, server, tool, args_hash, outcome, ms (and context)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self, server: str, tool: str, args_hash: str | None, outcome: str, ms: float, **extra: Any
    ) -> None:
        row = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "server": server,
            "tool": tool,
            "args_hash": args_hash,
            "outcome": outcome,
            "ms": round(ms, 1),
            **{k: v for k, v in extra.items() if v is not None},
        }
        line = (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)  # one O_APPEND write per line: lines never interleave
            finally:
                os.close(fd)
        except OSError as exc:  # never the client's problem: said in the log
            log.error("mcp_proxy.audit_failed", path=str(self.path), error=str(exc), row=row)
