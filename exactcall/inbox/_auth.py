"""Who the approver is: from authentication, never from a form field.

Two modes (``exactcall inbox --auth``):

- ``token``: each approver logs in once with a token issued by ``exactcall inbox token NAME``
  (stored hashed); the inbox answers with a session cookie (HttpOnly, SameSite=Strict).
- ``proxy``: a reverse proxy that authenticates people (SSO, OIDC, mTLS) passes the name in a
  header. The inbox believes that header only from a request that also carries the proxy's
  shared secret (``--proxy-secret-env``): a request that reaches the inbox without passing
  through the proxy has no secret, and gets nothing, whatever name it claims.

Every POST must come from the inbox's own pages: its Origin (or Referer) is the inbox's, and it
carries the CSRF token of the session it was made in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from exactcall.inbox._tokens import NAME, TokenStore

__all__ = ["COOKIE", "Authenticator", "Identity", "ProxyAuth", "TokenAuth"]

COOKIE = "exactcall_inbox"
SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True)
class Identity:
    name: str
    session: str
    """What the CSRF token is bound to: the session id, or the proxy's name for the person."""


class Authenticator:
    """A mode: who a request comes from, and whether a POST is the inbox's own."""

    mode = "none"
    logs_in = False

    def __init__(self, public_url: str | None = None) -> None:
        self._key = secrets.token_bytes(32)
        self.public_url = public_url.rstrip("/") if public_url else None

    def identify(self, headers: Mapping[str, str]) -> Identity | None:
        raise NotImplementedError

    def csrf(self, who: Identity) -> str:
        return hmac.new(self._key, who.session.encode(), hashlib.sha256).hexdigest()

    def refuse_post(
        self, headers: Mapping[str, str], form: Mapping[str, str], who: Identity
    ) -> str | None:
        """Why a POST is refused (cross-site, or no/wrong CSRF token), or None."""
        origin = headers.get("Origin") or _origin_of(headers.get("Referer"))
        if origin is None:
            return "the request names no Origin: only the inbox's own pages may post"
        if origin not in self.origins(headers):
            return f"cross-site request from {origin} refused"
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf(who)):
            return "the page's form token is missing or from another session: reload the page"
        return None

    def origins(self, headers: Mapping[str, str]) -> set[str]:
        if self.public_url:
            return {_origin_of(self.public_url) or self.public_url}
        host = headers.get("Host", "")
        return {f"http://{host}", f"https://{host}"}


class TokenAuth(Authenticator):
    """Approver tokens -> a session cookie."""

    mode = "token"
    logs_in = True

    def __init__(self, store: TokenStore, public_url: str | None = None) -> None:
        super().__init__(public_url)
        self.store = store
        self._sessions: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def login(self, token: str) -> str | None:
        """A new session id for the token's approver, or None."""
        name = self.store.who(token.strip())
        if name is None:
            return None
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[sid] = (name, time.monotonic() + SESSION_SECONDS)
        return sid

    def logout(self, who: Identity) -> None:
        with self._lock:
            self._sessions.pop(who.session, None)

    def identify(self, headers: Mapping[str, str]) -> Identity | None:
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("Cookie", ""))
        except Exception:
            return None
        morsel = cookie.get(COOKIE)
        if morsel is None:
            return None
        with self._lock:
            found = self._sessions.get(morsel.value)
            if found is None:
                return None
            if found[1] < time.monotonic():
                del self._sessions[morsel.value]
                return None
        return Identity(found[0], morsel.value)


class ProxyAuth(Authenticator):
    """A verified name header from an authenticating reverse proxy, with its shared secret."""

    mode = "proxy"

    def __init__(
        self, header: str, secret: str, secret_header: str, public_url: str | None = None
    ) -> None:
        super().__init__(public_url)
        if len(secret) < 16:
            raise ValueError(
                "--auth proxy needs the proxy's shared secret (at least 16 characters) in the "
                "environment variable named by --proxy-secret-env: without it anyone who can "
                "reach the inbox could claim any name in the header"
            )
        self.header, self.secret_header, self._secret = header, secret_header, secret

    def identify(self, headers: Mapping[str, str]) -> Identity | None:
        given = headers.get(self.secret_header) or ""
        if not hmac.compare_digest(given.encode(), self._secret.encode()):
            return None
        name = (headers.get(self.header) or "").strip()
        if not NAME.match(name):
            return None
        return Identity(name, "proxy:" + name)


def _origin_of(url: str | None) -> str | None:
    if not url:
        return None
    u = urlsplit(url)
    if not u.scheme or not u.netloc:
        return None
    return f"{u.scheme}://{u.netloc}"
