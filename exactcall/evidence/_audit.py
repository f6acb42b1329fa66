"""``exactcall audit``: every guarded call of a namespace, from Temporal alone; and an export
that anyone can verify without a server.

Listing reads the namespace's visibility (newest run first, as Temporal lists them: running
runs, then by close time), fetches each run's history (a few at a time, in order: it prints
the first run's calls while the next ones are fetched, and never holds more than a few
histories), and reads its calls with ``_calls.calls_in_history``, newest call first. A call
whose outcome was unknown gets its verdict from its reconciliation's memo.

An export is JSON lines: a header, one line per call, a closing line. Every line after the
first carries ``prev``, the sha256 of the line before it; call lines are numbered ``n`` from 1;
the closing line counts them and, signed, carries an Ed25519 signature over itself (without
the signature). Two exports with the same filters over closed calls have the same call lines.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import hashlib
import io
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecution
from temporalio.converter import DataConverter

from exactcall._calls import Approver, RunCall, calls_in_history, link_undos, with_verdicts
from exactcall._wire import (
    AUDIT_EXPORT_FORMAT,
    RECONCILE_WORKFLOW,
    RECORD_WORKFLOW,
    RUN_CLAIM_WORKFLOW,
    SESSION_LOCK_WORKFLOW,
    session_id_prefix,
    undo_id,
)
from exactcall.undo._undo import is_undo_step

__all__ = [
    "EXPORT_FORMAT",
    "AuditFilter",
    "Verified",
    "audit_rows",
    "export",
    "key_id",
    "verify",
]

EXPORT_FORMAT = AUDIT_EXPORT_FORMAT
OUTCOMES = (
    "done",
    "undone",
    "failed",
    "conflict",
    "unknown",
    "unresolved",
    "abandoned",
    "denied",
    "expired",
    "cancelled",
    "refused",
    "approved",
    "running",
    "pending",
)
"""What ``--outcome`` takes. ``unknown`` also matches every call whose outcome was unknown
before its reconciliation settled it."""

_OWN_TYPES = (RECORD_WORKFLOW, RECONCILE_WORKFLOW, RUN_CLAIM_WORKFLOW, SESSION_LOCK_WORKFLOW)
_PREFETCH = 6


@dataclass
class AuditFilter:
    workflow: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    tools: tuple[str, ...] = ()
    outcome: str | None = None
    limit: int | None = None
    redact: bool = False

    def query(self) -> str:
        own = ", ".join(f"'{t}'" for t in _OWN_TYPES)
        parts = [f"WorkflowType NOT IN ({own})"]
        if self.workflow and self.workflow.endswith("*"):
            parts.append(f"WorkflowId STARTS_WITH {_quote(self.workflow[:-1])}")
        elif self.workflow:  # and the undos `exactcall undo` made of its calls, and the
            # calls of the exactcall.session of that id
            ids = (_quote(self.workflow), _quote(undo_id(self.workflow)))
            calls = _quote(session_id_prefix(self.workflow) + "/")
            parts.append(f"(WorkflowId IN ({', '.join(ids)}) OR WorkflowId STARTS_WITH {calls})")
        if self.since:
            parts.append(f"(CloseTime >= '{_iso(self.since)}' OR ExecutionStatus = 'Running')")
        if self.until:
            parts.append(f"StartTime <= '{_iso(self.until)}'")
        return " AND ".join(parts)

    def keeps(self, c: RunCall) -> bool:
        if self.tools and c.tool not in self.tools:
            return False
        if self.since and c.time < self.since:
            return False
        if self.until and c.time > self.until:
            return False
        if self.outcome == "unknown":
            return c.was_unknown
        return self.outcome is None or c.outcome == self.outcome

    def as_json(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "since": self.since and _iso(self.since),
            "until": self.until and _iso(self.until),
            "tools": list(self.tools),
            "outcome": self.outcome,
            "limit": self.limit,
            "redact": self.redact,
        }


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- listing ---------------------------------------------------------------------------------
async def audit_rows(
    client: Client,
    flt: AuditFilter,
    *,
    approver_keys: Mapping[str, Any] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The calls that pass ``flt``, as rows (newest run first, newest call first in a run)."""
    conv = client.data_converter
    keys = dict(approver_keys or {})
    count = 0
    undos: list[RunCall] = []  # made so far, in runs listed earlier (exactcall undo's)
    async for calls in _runs(client, conv, flt.query()):
        await with_verdicts(client, calls)
        undos += [c for c in calls if is_undo_step(c.step) and c.outcome == "done"]
        link_undos(calls, undos)
        for c in sorted(calls, key=lambda c: c.time, reverse=True):
            if not flt.keeps(c):
                continue
            yield row(c, redact=flt.redact, approver_keys=keys)
            count += 1
            if flt.limit is not None and count >= flt.limit:
                return


async def _runs(client: Client, conv: DataConverter, query: str) -> AsyncIterator[list[RunCall]]:
    """Each listed run's calls, in listing order; a few histories are fetched ahead."""
    pending: asyncio.Queue[asyncio.Task[list[RunCall]] | None] = asyncio.Queue(_PREFETCH)

    async def calls(ex: WorkflowExecution) -> list[RunCall]:
        handle = client.get_workflow_handle(ex.id, run_id=ex.run_id)
        history = await handle.fetch_history()
        return await calls_in_history(history, conv, run_id=ex.run_id, namespace=client.namespace)

    async def produce() -> None:
        try:
            async for ex in client.list_workflows(query, page_size=200):
                await pending.put(asyncio.create_task(calls(ex)))
        finally:
            await pending.put(None)

    producer = asyncio.create_task(produce())
    try:
        while (task := await pending.get()) is not None:
            yield await task
        await producer  # raises what listing raised
    finally:
        producer.cancel()
        while not pending.empty():
            t = pending.get_nowait()
            if t is not None:
                t.cancel()


def key_id(public_key: Any) -> str:
    """A short, stable name for an Ed25519 public key: ``ed25519:`` + 16 hex of its sha256."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def row(c: RunCall, *, redact: bool = False, approver_keys: Mapping[str, Any] = {}) -> dict:
    """One call as the audit shows and exports it (JSON-ready, stable keys)."""
    return {
        "time": _iso(c.time),
        "workflow_id": c.workflow_id,
        "run_id": c.run_id,
        "workflow_type": c.workflow_type,
        "step": c.step,
        "tool": c.tool,
        "tool_version": c.tool_version,
        "args": None if redact else c.args,
        "args_hash": c.args_hash,
        "key": c.key,
        "outcome": c.outcome,
        "ended_at": c.ended_at and _iso(c.ended_at),
        "attempts": c.attempts,
        "error": (c.error_type if c.error else None) if redact else _error(c),
        "needed_approval": c.needed_approval,
        "approved_by": [_person(a, c.workflow_id, approver_keys) for a in c.approved_by],
        "denied_by": c.denied_by and _person(c.denied_by, c.workflow_id, approver_keys),
        "reason": c.reason,
        "verdict": c.verdict,
        "settled_by": c.settled_by,
        "undone_by": c.undone_by,
    }


def _error(c: RunCall) -> str | None:
    if c.error is None or not c.error_type or c.error.startswith(f"{c.error_type}: "):
        return c.error
    return f"{c.error_type}: {c.error}"


def _person(a: Approver, workflow_id: str, keys: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": a.name,
        "at": a.at and _iso(a.at),
        "signed": a.signed,
        "key_id": None,
    }
    key = keys.get(a.name)
    if a.signed and key is not None and a.decision is not None:
        from cryptography.exceptions import InvalidSignature

        from exactcall.approvals._binding import Decision, signed_payload

        try:
            d = Decision.model_validate(a.decision)
            key.verify(base64.b64decode(d.signature or ""), signed_payload(workflow_id, d))
        except (InvalidSignature, ValueError):
            out["signature"] = "invalid"
        else:
            out["signature"] = "valid"
            out["key_id"] = key_id(key)
    return out


# -- showing ---------------------------------------------------------------------------------
CSV_FIELDS = (
    "time",
    "workflow_id",
    "run_id",
    "step",
    "tool",
    "args",
    "args_hash",
    "key",
    "outcome",
    "verdict",
    "settled_by",
    "approved_by",
    "denied_by",
    "reason",
    "error",
)


def csv_header() -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(CSV_FIELDS)
    return buf.getvalue()


def csv_line(r: dict[str, Any]) -> str:
    out = []
    for f in CSV_FIELDS:
        v = r.get(f)
        if f == "args":
            v = "" if v is None else canonical(v)
        elif f == "approved_by":
            v = "; ".join(_who(p) for p in v or ())
        elif f == "denied_by":
            v = _who(v) if v else ""
        out.append("" if v is None else v)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(out)
    return buf.getvalue()


def text_line(r: dict[str, Any]) -> str:
    when = r["time"].replace("T", " ")[:19]
    outcome = r["outcome"]
    if r["verdict"]:
        outcome += f" (unknown, then {r['verdict']} by {r['settled_by'] or '?'})"
    if r.get("undone_by"):
        outcome += f" (by {r['undone_by']})"
    people = ""
    if r["approved_by"]:
        people = "  approved by " + ", ".join(_who(p) for p in r["approved_by"])
    if r["denied_by"]:
        people = "  denied by " + _who(r["denied_by"])
        if r["reason"]:
            people += f": {r['reason']}"
    if r["error"] and r["outcome"] in ("failed", "conflict", "unknown", "abandoned"):
        people += f"  {r['error']}"
    args = "args redacted" if r["args"] is None else canonical(r["args"])
    return (
        f"{when}  {r['workflow_id']}  {r['step']}  {outcome}{people}\n"
        f"    {r['tool']} {args}  hash {r['args_hash'][:16]}"
    )


def _who(p: dict[str, Any]) -> str:
    signed = "signed" if p["signed"] else "unsigned"
    if p.get("key_id"):
        signed += f" {p['key_id']}"
    elif p.get("signature") == "invalid":
        signed += ", signature INVALID"
    at = f" at {p['at'].replace('T', ' ')[:19]}" if p.get("at") else ""
    return f"{p['name']}{at} ({signed})"


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


# -- export ----------------------------------------------------------------------------------
def _sha(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


async def export(
    client: Client,
    flt: AuditFilter,
    out: io.TextIOBase | Any,
    *,
    namespace: str,
    version: str,
    signing_key: Any = None,
    approver_keys: Mapping[str, Any] | None = None,
) -> int:
    """Write the export to ``out`` (a text file); the number of calls."""
    header = {
        "type": "header",
        "format": EXPORT_FORMAT,
        "namespace": namespace,
        "filters": flt.as_json(),
        "exactcall_version": version,
    }
    prev = _write(out, header)
    n = 0
    async for r in audit_rows(client, flt, approver_keys=approver_keys):
        n += 1
        prev = _write(out, {"type": "call", "n": n, "prev": prev, **r})
    end: dict[str, Any] = {
        "type": "end",
        "count": n,
        "prev": prev,
        "exported_at": _iso(datetime.now(UTC)),
    }
    if signing_key is not None:
        end["key_id"] = key_id(signing_key.public_key())
        sig = signing_key.sign(canonical(end).encode())
        end["signature"] = base64.b64encode(sig).decode()
    _write(out, end)
    return n


def _write(out: Any, obj: dict[str, Any]) -> str:
    line = canonical(obj)
    out.write(line + "\n")
    return _sha(line.encode())


@dataclass
class Verified:
    ok: bool
    """Nothing was changed (and the signature, when checked, matches)."""
    calls: int = 0
    signed: bool = False
    signature: str = "absent"
    """absent, valid, invalid, or not checked (signed, but no key was given)."""
    key_id: str | None = None
    problem: str | None = None
    line: int | None = None
    not_an_export: bool = False
    header: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        if self.not_an_export:
            return f"not an exactcall audit export: {self.problem}"
        if not self.ok:
            return f"CHANGED: {self.problem}"
        if self.signature == "valid":
            how = f"signed by {self.key_id}, and the signature matches the key given"
        elif self.signature == "not checked":
            how = f"signed by {self.key_id}; signature not checked (pass --key PUB.pem)"
        else:
            how = (
                "not signed: the hash chain shows edits, but not a file rewritten from start "
                "to end (export with --sign KEY.pem)"
            )
        return f"intact: {self.calls} calls, {how}"

    def as_json(self) -> dict[str, Any]:
        return {
            "intact": self.ok,
            "calls": self.calls,
            "signed": self.signed,
            "signature": self.signature,
            "key_id": self.key_id,
            "problem": self.problem,
            "line": self.line,
            "export": not self.not_an_export,
        }


def verify(path: str | Path, public_key: Any = None) -> Verified:
    """Check an export: the chain, the numbering, the count, and (given a key) the signature."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Verified(False, problem=f"{path}: {exc.strerror or exc}", not_an_export=True)
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    if complete:
        lines = lines[:-1]
    try:
        header = json.loads(lines[0])
        assert isinstance(header, dict) and header.get("type") == "header"
    except (ValueError, AssertionError, IndexError):
        return Verified(False, problem="its first line is not an export header", not_an_export=True)
    if header.get("format") != EXPORT_FORMAT:
        return Verified(
            False,
            problem=f"format {header.get('format')!r}, this exactcall reads {EXPORT_FORMAT!r}",
            not_an_export=True,
        )
    numbers = _numbers(lines)
    expected = 1
    for i in range(1, len(lines)):
        lineno = i + 1
        try:
            obj = json.loads(lines[i])
            assert isinstance(obj, dict)
        except (ValueError, AssertionError):
            cut = " (the file is cut off)" if i == len(lines) - 1 and not complete else ""
            return _changed(lineno, f"line {lineno} is not a JSON object{cut}")
        chained = obj.get("prev") == _sha(lines[i - 1])
        kind = obj.get("type")
        if kind == "end":
            if i != len(lines) - 1:
                return _changed(lineno, f"line {lineno} closes the export, but lines follow it")
            if obj.get("count") != expected - 1:
                missing = obj.get("count")
                return _changed(
                    lineno,
                    f"the closing line (line {lineno}) counts {missing} calls, the file has "
                    f"{expected - 1}: calls were removed from the end, or the count was altered",
                )
            if not chained:
                return _changed(i, _altered(i))
            return _signature(obj, expected - 1, public_key, header)
        if kind != "call" or not isinstance(obj.get("n"), int):
            return _changed(lineno, f"line {lineno} is neither a call nor the closing line")
        n = obj["n"]
        if n == expected and chained:
            expected += 1
            continue
        if n > expected and any(m in numbers[i + 1 :] for m in range(expected, n)):
            return _changed(
                lineno,
                f"lines were reordered: line {lineno} is call {n}, but call {expected} comes "
                "later in the file",
            )
        if i + 1 < len(lines) and _prev_of(lines[i + 1]) == _sha(lines[i - 1]):
            return _changed(
                lineno, f"line {lineno} was inserted: line {lineno + 1} chains to line {i}"
            )
        if n < expected and i >= 2 and obj.get("prev") == _sha(lines[i - 2]):
            return _changed(i, f"line {i} was inserted: line {lineno} chains to line {i - 1}")
        if n == expected:
            return _changed(i, _altered(i))
        if n < expected:
            return _changed(
                lineno,
                f"line {lineno} was inserted or moved: it is call {n}, which came before "
                f"(call {expected} was due)",
            )
        gone = f"call {expected}" if n == expected + 1 else f"calls {expected}-{n - 1}"
        return _changed(lineno, f"{gone} removed: line {lineno} is call {n}")
    last = len(lines)
    return _changed(
        last,
        f"the file is truncated: it ends after line {last} (call {expected - 1}) with no "
        "closing line",
    )


def _prev_of(line: bytes) -> Any:
    try:
        return json.loads(line).get("prev")
    except (ValueError, AttributeError):
        return None


def _numbers(lines: list[bytes]) -> list[int | None]:
    out: list[int | None] = []
    for line in lines:
        try:
            n = json.loads(line).get("n")
        except (ValueError, AttributeError):
            n = None
        out.append(n if isinstance(n, int) else None)
    return out


def _altered(i: int) -> str:
    """Line ``i`` (1-based) no longer hashes to what the line after it carries."""
    what = "the header" if i == 1 else f"line {i}"
    return f"{what} was altered: line {i + 1} carries a hash of different content"


def _changed(line: int, problem: str) -> Verified:
    return Verified(False, problem=problem, line=line)


def _signature(end: dict[str, Any], calls: int, public_key: Any, header: dict) -> Verified:
    sig = end.get("signature")
    if not sig:
        return Verified(True, calls=calls, header=header)
    kid = end.get("key_id")
    if public_key is None:
        return Verified(True, calls=calls, signed=True, signature="not checked", key_id=kid)
    from cryptography.exceptions import InvalidSignature

    unsigned = {k: v for k, v in end.items() if k != "signature"}
    try:
        public_key.verify(base64.b64decode(sig), canonical(unsigned).encode())
    except (InvalidSignature, ValueError):
        given = key_id(public_key)
        why = (
            f"it says {kid}, the key given is {given}"
            if kid != given
            else "the closing line or its signature was altered"
        )
        return Verified(
            False,
            calls=calls,
            signed=True,
            signature="invalid",
            key_id=kid,
            problem=f"the signature does not match the key given ({why})",
            line=None,
        )
    return Verified(True, calls=calls, signed=True, signature="valid", key_id=key_id(public_key))


def load_public_key(path: str | Path) -> Any:
    """An Ed25519 public key from a PEM file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def approver_keys(specs: Iterable[str]) -> dict[str, Any]:
    """``NAME=PUB.pem`` pairs -> {name: key}."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{spec!r}: use NAME=PUB.pem")
        out[name] = load_public_key(path)
    return out
