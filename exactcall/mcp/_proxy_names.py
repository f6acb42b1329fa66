"""A proxy's default name (the scope of its identity and its task queue), from its command or
its URL, and what a name may be."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["NAME", "derive_name", "derive_url_name"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LAUNCHERS = {"python", "python3", "node", "npx", "uv", "uvx", "bun", "bunx", "deno", "pipx", "run"}


def derive_name(command: list[str]) -> str:
    """A stable server name from its command: its first meaningful word + a hash of it all."""
    digest = hashlib.sha256(json.dumps(command).encode()).hexdigest()[:8]
    words = [Path(command[0]).name, *command[1:]]
    main = next(
        (w for w in words if not w.startswith("-") and re.sub(r"[\d.]+$", "", w) not in _LAUNCHERS),
        words[0],
    )
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(main).name).strip("-.") or "server"
    return f"{readable[:40]}-{digest}"


def derive_url_name(url: str) -> str:
    """A stable server name from its URL (never its headers): its host + a hash of the URL."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    host = urlsplit(url).hostname or "server"
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", host).strip("-.") or "server"
    return f"{readable[:40]}-{digest}"
