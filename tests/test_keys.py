"""``exactcall keys new NAME`` (issue 33 §3): the key pair that signed approvals and signed
exports take, in the forms they read."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from exactcall.approvals._binding import ed25519_verifier
from exactcall.approvals._client import load_signing_key
from tests.conftest import ROOT


def keys(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactcall", "keys", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_keys_new_writes_a_pair_that_signs_and_verifies(tmp_path: Path) -> None:
    out = keys("new", "ops-lead", "--dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    private, public = Path(made["private"]), Path(made["public"])
    assert (private.name, public.name) == ("ops-lead.key.pem", "ops-lead.pub.pem")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600  # the owner's only
    assert made["key_id"].startswith("ed25519:")
    signer = load_signing_key(private)  # what `exactcall approve --key` loads
    verify = ed25519_verifier({"ops-lead": public.read_bytes()})  # approver_keys=
    assert verify("ops-lead", b"payload", signer.sign(b"payload"))
    assert not verify("ops-lead", b"other", signer.sign(b"payload"))

    text = keys("new", "second", "--dir", str(tmp_path))
    assert text.returncode == 0 and "--key" in text.stdout and "approver_keys" in text.stdout


def test_keys_new_never_overwrites_and_refuses_bad_names(tmp_path: Path) -> None:
    assert keys("new", "ops", "--dir", str(tmp_path)).returncode == 0
    before = (tmp_path / "ops.key.pem").read_bytes()
    again = keys("new", "ops", "--dir", str(tmp_path))
    assert again.returncode == 2 and "nothing was written" in again.stderr
    assert (tmp_path / "ops.key.pem").read_bytes() == before
    bad = keys("new", "../evil", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "not a key name" in bad.stderr
    missing = keys("new", "ops", "--dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "not a folder" in missing.stderr
