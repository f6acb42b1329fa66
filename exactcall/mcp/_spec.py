"""Where a worker finds an MCP server: a stdio command or a streamable HTTP URL, and trust.

Plain data (``Plugin(mcp_servers={"bank": ["python", "-m", "bank_server"]})``), the
``--mcp-server NAME=COMMAND|URL`` flag, or an :class:`McpServerSpec`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp import StdioServerParameters

__all__ = ["McpServerSpec", "check_server_name", "parse_server_option", "server_spec"]

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class McpServerSpec:
    """How a worker reaches one MCP server: a stdio ``command`` or a streamable HTTP ``url``.

    ``trusted``: the server's ``readOnlyHint`` may decide that a tool defined with
    ``read_only=None`` is read-only (the MCP spec: hints of untrusted servers must not decide
    anything). ``env`` is merged over the MCP SDK's safe default environment (PATH, HOME, ...);
    ``cwd`` is where a stdio server starts.
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    trusted: bool = False

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server spec needs exactly one of command= or url=")
        if self.command is not None and (
            not self.command or not all(isinstance(c, str) and c for c in self.command)
        ):
            raise ValueError(f"MCP server command {self.command!r}: give a list of strings")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server url {self.url!r}: expected http:// or https://")

    def target(self) -> StdioServerParameters | str:
        """What ``mcp.Client`` connects to."""
        if self.url is not None:
            return self.url
        assert self.command is not None
        return StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            env=dict(self.env) if self.env else None,
            cwd=self.cwd,
        )

    def describe(self) -> str:
        return self.url if self.url is not None else shlex.join(self.command or ())


def server_spec(value: Any, *, trusted: bool | None = None) -> McpServerSpec:
    """An :class:`McpServerSpec` from plain data: a list of strings (a stdio command), a URL
    string, a mapping ``{"command": [...] | "url": ..., "env", "cwd", "trusted"}``, or a spec."""
    if isinstance(value, McpServerSpec):
        spec = value
    elif isinstance(value, str):
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"MCP server {value!r}: a string is a streamable HTTP URL; give a stdio "
                "command as a list of strings, e.g. ['python', '-m', 'my_server']"
            )
        spec = McpServerSpec(url=value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"command", "args", "url", "env", "cwd", "trusted"}
        if unknown:
            raise ValueError(f"MCP server spec {dict(value)!r}: unknown keys {sorted(unknown)}")
        command = value.get("command")
        if isinstance(command, str):
            command = [command, *value.get("args", [])]
        spec = McpServerSpec(
            command=tuple(command) if command is not None else None,
            url=value.get("url"),
            env=value.get("env"),
            cwd=str(value["cwd"]) if value.get("cwd") is not None else None,
            trusted=bool(value.get("trusted", False)),
        )
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        spec = McpServerSpec(command=tuple(value))
    else:
        raise ValueError(
            f"MCP server spec {value!r}: give a command (list of strings), a URL, or "
            "exactcall.mcp.McpServerSpec(...)"
        )
    if trusted is not None and trusted != spec.trusted:
        spec = McpServerSpec(spec.command, spec.url, spec.env, spec.cwd, trusted)
    return spec


def parse_server_option(text: str) -> tuple[str, McpServerSpec]:
    """``NAME=COMMAND`` (split like a shell) or ``NAME=URL``: the ``--mcp-server`` flag."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest.strip():
        raise ValueError(
            f"--mcp-server {text!r}: expected NAME=COMMAND or NAME=URL, e.g. "
            "bank='python -m bank_server' or bank=http://localhost:8000/mcp"
        )
    check_server_name(name)
    rest = rest.strip()
    if rest.startswith(("http://", "https://")):
        return name, McpServerSpec(url=rest)
    return name, McpServerSpec(command=tuple(shlex.split(rest)))


def check_server_name(name: str) -> str:
    if not isinstance(name, str) or not _SERVER_NAME.match(name):
        raise ValueError(
            f"MCP server name {name!r}: use 1-64 letters, digits, '_' or '-' (it is part of "
            "the tool's activity name mcp.<server>.<tool>)"
        )
    return name
