"""HTTP headers given on the command line (``--header NAME=VALUE``), without the MCP SDK."""

from __future__ import annotations

import os
import re

__all__ = ["expand_header", "parse_header"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def expand_header(value: str) -> str:
    """``Bearer ${TOKEN}`` -> ``Bearer <$TOKEN>`` (a secret need not be on the command line,
    where any user can read it in the process list). A variable that is not set is an error."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise ValueError(f"${{{name}}} is not set in the environment")
        return os.environ[name]

    return _VAR.sub(one, value)


def parse_header(text: str) -> tuple[str, str]:
    """``Authorization=Bearer ${TOKEN}`` or ``Authorization: Bearer x`` -> (name, value)."""
    eq, colon = text.find("="), text.find(":")
    cut = min(i for i in (eq, colon) if i >= 0) if max(eq, colon) >= 0 else -1
    name, value = (text[:cut].strip(), text[cut + 1 :].strip()) if cut > 0 else ("", "")
    if not name or not _TOKEN.fullmatch(name):
        raise ValueError(f"{text!r}: use NAME=VALUE, e.g. Authorization=Bearer ${{TOKEN}}")
    return name, expand_header(value)
