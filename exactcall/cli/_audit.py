"""``exactcall audit``, ``exactcall audit export`` and ``exactcall audit verify``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "run"]

EXIT_OK, EXIT_CHANGED, EXIT_USAGE = 0, 1, 2

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str) -> datetime:
    """``2026-12-01``, ``2026-12-01T10:00:00Z`` (UTC when no zone is given), or ``2h`` /
    ``7d`` ago (argparse type)."""
    from datetime import timedelta

    m = _AGO.match(text)
    if m:
        return datetime.now(UTC) - timedelta(seconds=float(m.group(1)) * _SECONDS[m.group(2)])
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use 2026-12-01, 2026-12-01T10:00:00Z, or an age (90m, 2h, 7d)"
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _filters(p: argparse.ArgumentParser) -> None:
    from exactcall.evidence._audit import OUTCOMES

    g = p.add_argument_group("which calls")
    g.add_argument(
        "--workflow",
        metavar="ID",
        help="one workflow id (all its runs); PREFIX* for every id that starts with PREFIX",
    )
    g.add_argument("--since", type=parse_time, metavar="TIME", help="calls made at or after")
    g.add_argument("--until", type=parse_time, metavar="TIME", help="calls made at or before")
    g.add_argument(
        "--tool", action="append", default=[], metavar="NAME", help="only this tool; repeatable"
    )
    g.add_argument(
        "--outcome",
        choices=OUTCOMES,
        help="only this outcome (unknown: every call whose outcome was unknown, resolved or not)",
    )
    g.add_argument("-n", type=int, dest="limit", metavar="N", help="at most N calls")
    g.add_argument(
        "--redact",
        action="store_true",
        help="leave the arguments out (their hash stays), and errors' text (their type stays)",
    )
    g.add_argument(
        "--approver-key",
        action="append",
        default=[],
        metavar="NAME=PUB.pem",
        help="an approver's Ed25519 public key: their signatures are checked, and each call "
        "shows the key id; repeatable",
    )


def add_parsers(sub: Any, connection_args: Any) -> None:
    a = sub.add_parser(
        "audit",
        help="every guarded call: who approved it, what became of it (export, verify)",
        description="Lists guarded calls, newest run first, read from the namespace's "
        "visibility and histories (no side store).",
    )
    fmt = a.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object per line")
    fmt.add_argument("--csv", action="store_true")
    _filters(a)
    connection_args(a)
    asub = a.add_subparsers(dest="audit_command")
    ex = asub.add_parser(
        "export",
        help="write the calls as a hash-chained JSON-lines file (signed with --sign)",
    )
    ex.add_argument("--out", required=True, type=Path, metavar="FILE")
    ex.add_argument("--sign", type=Path, metavar="KEY.pem", help="Ed25519 private key (PEM)")
    _filters(ex)
    connection_args(ex)
    v = asub.add_parser("verify", help="check an export: nothing changed; its signature")
    v.add_argument("file", type=Path)
    v.add_argument("--key", type=Path, metavar="PUB.pem", help="the signer's public key (PEM)")
    v.add_argument("--json", action="store_true", dest="verify_json")


def _flt(ns: argparse.Namespace) -> Any:
    from exactcall.evidence._audit import AuditFilter

    if ns.limit is not None and ns.limit < 1:
        raise ValueError(f"-n {ns.limit}: give a positive number of calls")
    if ns.since and ns.until and ns.since > ns.until:
        raise ValueError("--since is after --until: nothing could match")
    return AuditFilter(
        workflow=ns.workflow,
        since=ns.since,
        until=ns.until,
        tools=tuple(ns.tool),
        outcome=ns.outcome,
        limit=ns.limit,
        redact=ns.redact,
    )


def verify_command(ns: argparse.Namespace) -> int:
    from exactcall.evidence._audit import load_public_key, verify

    try:
        key = load_public_key(ns.key) if ns.key else None
    except (OSError, ValueError) as exc:
        print(f"exactcall audit verify: --key {ns.key}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    v = verify(ns.file, key)
    if ns.verify_json:
        print(json.dumps(v.as_json(), indent=2))
    else:
        print(v.text(), file=sys.stdout if v.ok else sys.stderr)
    if v.not_an_export:
        return EXIT_USAGE
    return EXIT_OK if v.ok else EXIT_CHANGED


async def run(ns: argparse.Namespace, connection: Any) -> int:
    from temporalio.service import RPCError

    from exactcall import __version__
    from exactcall._worker import connect
    from exactcall.evidence._audit import (
        approver_keys,
        audit_rows,
        csv_header,
        csv_line,
        export,
        text_line,
    )

    try:
        flt = _flt(ns)
        keys = approver_keys(ns.approver_key)
        signing = None
        if ns.audit_command == "export" and ns.sign:
            from exactcall.approvals._client import load_signing_key

            signing = load_signing_key(ns.sign)
    except (OSError, ValueError, TypeError) as exc:
        print(f"exactcall audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    client = await connect(connection)
    try:
        if ns.audit_command == "export":
            tmp = ns.out.with_name(ns.out.name + ".partial")
            try:
                with tmp.open("w", encoding="utf-8", newline="\n") as f:
                    n = await export(
                        client,
                        flt,
                        f,
                        namespace=client.namespace,
                        version=__version__,
                        signing_key=signing,
                        approver_keys=keys,
                    )
            except BaseException:
                tmp.unlink(missing_ok=True)  # never leave half an export that looks whole
                raise
            tmp.replace(ns.out)
            signed = " (signed)" if signing is not None else ""
            print(f"exported {n} calls to {ns.out}{signed}")
            return EXIT_OK
        n = 0
        if ns.csv:
            sys.stdout.write(csv_header())
        async for r in audit_rows(client, flt, approver_keys=keys):
            n += 1
            if ns.json:
                print(json.dumps(r, sort_keys=True, default=str), flush=True)
            elif ns.csv:
                sys.stdout.write(csv_line(r))
                sys.stdout.flush()
            else:
                print(text_line(r), flush=True)
        if not (ns.json or ns.csv):
            print(f"{n} call{'s' if n != 1 else ''}" if n else "no guarded calls match")
        return EXIT_OK
    except RPCError as exc:
        print(f"exactcall audit: the server refused: {exc}", file=sys.stderr)
        return EXIT_USAGE
