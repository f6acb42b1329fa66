"""``exactcall inbox``: serve the web inbox; ``exactcall inbox token NAME``: issue a token."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def _default_tokens() -> Path:
    from exactcall.embedded._server import state_dir

    return state_dir() / "inbox-tokens.json"


def add_parser(sub: Any, connection_args: Any) -> None:
    p = sub.add_parser("inbox", help="a web inbox for approvers (and notifications)")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--listen", default="127.0.0.1", help="IP to listen on (127.0.0.1)")
    p.add_argument("--auth", choices=("token", "proxy"), default="token")
    p.add_argument("--tokens", type=Path, default=None, help="token file (in the state folder)")
    p.add_argument("--proxy-header", default="X-Forwarded-User", help="name header (--auth proxy)")
    p.add_argument("--proxy-secret-header", default="X-Exactcall-Proxy-Secret")
    p.add_argument(
        "--proxy-secret-env",
        default="EXACTCALL_INBOX_PROXY_SECRET",
        help="environment variable holding the secret the proxy adds to every request",
    )
    p.add_argument("--public-url", help="the inbox's URL as browsers see it (behind a proxy)")
    p.add_argument("--keys-dir", type=Path, help="approvers' NAME.key.pem: decisions are signed")
    p.add_argument("--notify-url", help="POST approval events to this URL")
    p.add_argument("--notify-format", choices=("json", "slack"), default="json")
    p.add_argument("--notify-state", type=Path, default=None, help="events already sent (file)")
    p.add_argument("--notify-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    connection_args(p)
    s = p.add_subparsers(dest="inbox_command")
    t = s.add_parser("token", help="issue (or replace) an approver's login token; prints it once")
    t.add_argument("name", help="the approver's name, as the tools' approvers= lists it")
    t.add_argument("--tokens", type=Path, default=None, dest="token_file")


def run(ns: argparse.Namespace, connection: Any) -> int:
    if ns.inbox_command == "token":
        return _token(ns.token_file or ns.tokens or _default_tokens(), ns.name)
    try:
        auth = _auth(ns)
    except ValueError as exc:
        print(f"exactcall inbox: {exc}", file=sys.stderr)
        return 2
    return _serve(ns, auth, connection)


def _token(path: Path, name: str) -> int:
    from exactcall.inbox._tokens import issue_token

    try:
        token = issue_token(path, name)
    except ValueError as exc:
        print(f"exactcall inbox token: {exc}", file=sys.stderr)
        return 2
    print(token)
    print(f"(for {name}; only its hash is kept, in {path}: give it to {name} now)", file=sys.stderr)
    return 0


def _auth(ns: argparse.Namespace) -> Any:
    from exactcall.inbox._auth import ProxyAuth, TokenAuth
    from exactcall.inbox._tokens import TokenStore

    if ns.auth == "proxy":
        secret = os.environ.get(ns.proxy_secret_env, "")
        return ProxyAuth(ns.proxy_header, secret, ns.proxy_secret_header, ns.public_url)
    path = ns.tokens or _default_tokens()
    store = TokenStore(path)
    if not store.names():
        raise ValueError(
            f"no approver has a token yet ({path}): issue one with `exactcall inbox token NAME"
            f"{'' if ns.tokens is None else f' --tokens {path}'}`"
        )
    return TokenAuth(store, ns.public_url)


def _serve(ns: argparse.Namespace, auth: Any, connection: Any) -> int:
    from exactcall._worker import connect
    from exactcall.inbox._notify import Notifier, Webhook
    from exactcall.inbox._server import EventLoop, Inbox

    loop = EventLoop()
    try:
        client = loop.run(connect(connection))
    except Exception as exc:
        print(f"exactcall inbox: cannot reach Temporal: {exc}", file=sys.stderr)
        loop.stop()
        return 1
    inbox = Inbox(client, loop, auth, host=ns.listen, port=ns.port, keys_dir=ns.keys_dir)
    url = inbox.start()
    public = ns.public_url or url
    notifier = None
    if ns.notify_url:
        try:
            hook = Webhook(ns.notify_url, ns.notify_format)
        except ValueError as exc:
            print(f"exactcall inbox: {exc}", file=sys.stderr)
            return 2
        state = ns.notify_state or (ns.tokens or _default_tokens()).with_name("inbox-notified.json")
        notifier = Notifier(client, hook, public, state, ns.notify_interval)
        watch = asyncio.run_coroutine_threadsafe(notifier.run(), loop.loop)
    print(f"exactcall inbox: {url} (auth: {auth.mode}; pages link to {public})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    inbox.stop()
    if notifier is not None:
        watch.cancel()
        loop.run(notifier.drain())
    loop.stop()
    return 0
