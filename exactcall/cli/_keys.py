"""``exactcall keys new NAME``: an Ed25519 key pair for signed approvals and signed exports.

Writes ``NAME.key.pem`` (the private key, PKCS#8, readable by its owner only) and
``NAME.pub.pem`` (the public key, SubjectPublicKeyInfo), the forms ``exactcall approve
--key``, ``exactcall audit export --sign``, ``exactcall audit verify --key`` and
``exactcall.Plugin(approver_keys={NAME: ...})`` read. Never overwrites a file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "run"]

EXIT_OK, EXIT_USAGE = 0, 2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def add_parsers(sub: Any) -> None:
    k = sub.add_parser("keys", help="Ed25519 key pairs for signed approvals and signed exports")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    new = ksub.add_parser("new", help="write NAME.key.pem (private) and NAME.pub.pem (public)")
    new.add_argument("name", help="the approver's name (the files are named after it)")
    new.add_argument("--dir", type=Path, default=Path("."), help="where to write them")
    new.add_argument("--json", action="store_true")


def run(ns: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from exactcall.evidence._audit import key_id

    if not _NAME.fullmatch(ns.name):
        return _err(
            f"{ns.name!r} is not a key name: use letters, digits and . _ @ - (at most 64, "
            "starting with a letter or digit)"
        )
    private, public = ns.dir / f"{ns.name}.key.pem", ns.dir / f"{ns.name}.pub.pem"
    there = [str(p) for p in (private, public) if p.exists()]
    if there:
        verb = "exists" if len(there) == 1 else "exist"
        return _err(f"{' and '.join(there)} {verb} already: nothing was written")
    if not ns.dir.is_dir():
        return _err(f"{ns.dir} is not a folder")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(pub)
    kid = key_id(key.public_key())
    if ns.json:
        out = {"name": ns.name, "private": str(private), "public": str(public), "key_id": kid}
        print(json.dumps(out))
        return EXIT_OK
    plugin = f"exactcall.Plugin(approver_keys={{{ns.name!r}: Path({str(public)!r}).read_bytes()}})"
    print(f"wrote {private} (private: keep it to {ns.name}) and {public} ({kid})")
    print(
        f"  sign approvals:     exactcall approve WF STEP --hash H --as {ns.name} --key {private}"
    )
    print(f"  the worker checks:  {plugin}")
    print(f"  sign an export:     exactcall audit export --out calls.jsonl --sign {private}")
    print(f"  verify it:          exactcall audit verify calls.jsonl --key {public}")
    return EXIT_OK


def _err(msg: str) -> int:
    print(f"exactcall keys: {msg}", file=sys.stderr)
    return EXIT_USAGE
