"""Per-approver tokens: issued by ``exactcall inbox token NAME``, stored hashed.

The file keeps ``{"approvers": {NAME: {"sha256": HEX, "issued_at": ISO}}}``: a token is shown
once, when it is issued, and only its sha256 is written (a copy of the file lets nobody log
in). Issuing a new token for a name replaces the old one (the old token stops working).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["TokenStore", "issue_token"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
PREFIX = "ecx_"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """The approvers' token hashes in one JSON file (read on every login: a token issued or
    replaced while the inbox runs counts at once)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        approvers = data.get("approvers") if isinstance(data, dict) else None
        if not isinstance(approvers, dict):
            raise ValueError(f"{self.path}: not an exactcall inbox token file")
        return approvers

    def names(self) -> list[str]:
        return sorted(self._load())

    def who(self, token: str) -> str | None:
        """The approver whose token this is, or None (compared in constant time)."""
        if not token.startswith(PREFIX):
            return None
        d = _digest(token)
        found = None
        for name, entry in self._load().items():
            if hmac.compare_digest(entry.get("sha256", ""), d):
                found = name
        return found

    def issue(self, name: str) -> str:
        if not NAME.match(name):
            raise ValueError(
                f"approver name {name!r}: use letters, digits and . _ @ - (at most 64), the name "
                "your tools' approvers= lists"
            )
        token = PREFIX + secrets.token_urlsafe(32)
        approvers = self._load()
        approvers[name] = {"sha256": _digest(token), "issued_at": datetime.now(UTC).isoformat()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"approvers": approvers}, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)
        return token


def issue_token(path: str | os.PathLike[str], name: str) -> str:
    """A new token for ``name`` (printed once by the command; only its hash is kept)."""
    return TokenStore(path).issue(name)
