"""Which tools the proxy passes through (reads), guards as writes, or holds for approval;
the audit file.

:meth:`Policy.decide` answers per tool name, first match wins:

1. ``--read-only TOOL`` (and the deprecated ``--no-dedupe TOOL``): ``pass``, whatever else is
   known;
2. ``--approve TOOL``: ``approve`` (guarded as a write, and waits for ``exactcall approve``);
3. ``--write TOOL`` (and the deprecated ``--dedupe TOOL``) or ``--dedupe-window TOOL=D``:
   ``guard``;
4. with ``--trusted``, the server's ``readOnlyHint: true`` (from ``tools/list``): ``pass``.
   Without it the hint decides nothing (the MCP spec: hints from untrusted servers must not
   drive decisions);
5. the name, by the one classifier the scan uses too (:mod:`exactcall.mcp._classify`): a name
   whose first word is a read verb (``get``, ``list``, ``search``, ``read``, ``open``,
   ``fetch``, ``echo``, ...) and that has no sign of a write (``get_and_delete``,
   ``open_ticket`` are writes): ``pass``;
6. everything else: ``guard``.

A tool given both as a read and as a write (or approval, or a window) is a usage error
(:func:`usage_errors`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import structlog

from exactcall.mcp._classify import READ_VERBS, first_word, read_for_proxy

__all__ = [
    "READ_VERBS",
    "Audit",
    "Decision",
    "Policy",
    "duration_text",
    "first_word",
    "usage_errors",
]

log = structlog.get_logger("exactcall")

Action = Literal["pass", "guard", "approve"]


def usage_errors(
    read_only: Iterable[str],
    write: Iterable[str],
    approve: Iterable[str],
    dedupe_windows: Mapping[str, timedelta] | Iterable[str],
) -> list[str]:
    """Flags that contradict each other for one tool: a read that is also a write, needs
    approval or has a dedupe window."""
    reads = set(read_only)
    given = {
        "--write": set(write),
        "--approve": set(approve),
        "--dedupe-window": set(dedupe_windows),
    }
    errors = []
    for tool in sorted(reads & set().union(*given.values())):
        flags = "/".join(flag for flag, tools in given.items() if tool in tools)
        errors.append(
            f"tool {tool!r} is given both as a read (--read-only) and as a write ({flags}): "
            "keep one"
        )
    return errors


@dataclass(frozen=True)
class Decision:
    """What the proxy does with one tool's calls, and why (readable, for logs and the scan)."""

    action: Action
    """``pass``: passes through; ``guard``: a write, run once on Temporal; ``approve``: guarded
    and waits for a person's approval of its exact arguments."""
    reason: str
    """``--read-only``, ``the name starts with 'get'``, ``not known to be read-only``, ..."""
    window: timedelta | None = None
    """The tool's ``--dedupe-window``, if any."""


@dataclass
class Policy:
    """Decides, per tool name, what the proxy does with a ``tools/call`` (see the module doc)."""

    read_only: frozenset[str] = frozenset()
    """``--read-only TOOL`` (and the deprecated ``--no-dedupe TOOL``)."""
    write: frozenset[str] = frozenset()
    """``--write TOOL`` (and the deprecated ``--dedupe TOOL``)."""
    approve: frozenset[str] = frozenset()
    """``--approve TOOL``."""
    dedupe_windows: Mapping[str, timedelta] = field(default_factory=dict)
    """``--dedupe-window TOOL=D``: identical calls within D run once (the tool is a write)."""
    trusted: bool = False
    """``--trusted``: the server's ``readOnlyHint`` decides."""
    annotations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tool name -> its ``annotations`` object, as last seen in a ``tools/list`` result."""
    output_schemas: dict[str, Any] = field(default_factory=dict)
    """Tool name -> its ``outputSchema`` (None: it has none), from the same results."""

    @classmethod
    def from_flags(cls, ns: Any) -> tuple[Policy, list[str]]:
        """The policy of the proxy's flags on ``ns`` (``exactcall mcp proxy`` and ``scan``; the
        deprecated ``--dedupe``/``--no-dedupe`` count as ``--write``/``--read-only``), and the
        flags that contradict each other (:func:`usage_errors`)."""

        def given(flag: str) -> list[str]:
            return list(getattr(ns, flag, None) or [])

        read_only = [*given("read_only"), *given("no_dedupe")]
        write = [*given("write"), *given("dedupe")]
        approve = given("approve")
        windows = dict(getattr(ns, "dedupe_window", None) or [])
        policy = cls(
            read_only=frozenset(read_only),
            write=frozenset(write),
            approve=frozenset(approve),
            dedupe_windows=windows,
            trusted=bool(getattr(ns, "trusted", False)),
        )
        return policy, usage_errors(read_only, write, approve, windows)

    def learn(self, tools_list_result: Any) -> None:
        """Read (never change) a ``tools/list`` result for the tools' annotations."""
        tools = tools_list_result.get("tools") if isinstance(tools_list_result, dict) else None
        for t in tools if isinstance(tools, list) else []:
            if isinstance(t, dict) and isinstance(t.get("name"), str):
                ann = t.get("annotations")
                self.annotations[t["name"]] = ann if isinstance(ann, dict) else {}
                self.output_schemas[t["name"]] = t.get("outputSchema")

    def needs_listing(self, tool: str) -> bool:
        """Whether the tool's annotations would matter but are not known yet."""
        return self.trusted and tool not in self.annotations and self._flagged(tool) is None

    def decide(self, tool: str) -> Decision:
        """What the proxy does with a call of ``tool``."""
        flagged = self._flagged(tool)
        if flagged is not None:
            return flagged
        read, why = read_for_proxy(tool, self.annotations.get(tool), self.trusted)
        return Decision("pass" if read else "guard", why)

    def is_write(self, tool: str) -> tuple[bool, str]:
        """(whether the proxy takes the call over, why)."""
        d = self.decide(tool)
        return d.action != "pass", d.reason

    def _flagged(self, tool: str) -> Decision | None:
        window = self.dedupe_windows.get(tool)
        if tool in self.read_only:
            return Decision("pass", "--read-only")
        if tool in self.approve:
            return Decision("approve", "--approve", window)
        if tool in self.write:
            return Decision("guard", "--write", window)
        if window is not None:
            return Decision(
                "guard", f"--dedupe-window {duration_text(window.total_seconds())}", window
            )
        return None


def duration_text(seconds: float) -> str:
    """``600`` -> ``10m``, ``1.5`` -> ``1.5s``: as the flags take durations."""
    s = seconds
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size and s % size == 0:
            return f"{int(s // size)}{unit}"
    return f"{s:g}s"


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
