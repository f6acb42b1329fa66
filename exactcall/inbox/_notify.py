"""Notifications: POST an event when a call starts waiting, is decided, and settles.

Sent by a watcher outside the workflows (``exactcall inbox --notify-url``), which reads the
same listing and audit as the inbox: nothing in a workflow changes, nothing is replayed, and a
webhook that is slow, down or refusing can never block or change a call. Each event is tried
a bounded number of times (then logged and dropped), and remembered in a small state file, so
a restarted watcher does not announce a call twice. Run one watcher per namespace.

Events: ``approval_requested`` (a call started waiting), ``approval_decided`` (approved,
denied, expired or cancelled: it stopped waiting), ``call_settled`` (the call's outcome: done,
failed, denied, ...). Each carries the workflow id, step, tool, args hash and a link to the
inbox. Two formats: ``json`` (the event as an object) and ``slack`` (an incoming webhook's
``{"text": ...}``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from temporalio.client import Client

from exactcall.approvals import ApprovalRequest, list_pending
from exactcall.evidence._audit import AuditFilter, audit_rows

__all__ = ["Event", "Notifier", "Webhook"]

log = logging.getLogger("exactcall.inbox.notify")

Format = Literal["json", "slack"]
UNSETTLED = ("pending", "approved", "running")
REMEMBERED = 20_000


@dataclass(frozen=True)
class Event:
    event: Literal["approval_requested", "approval_decided", "call_settled"]
    workflow_id: str
    step: str
    tool: str
    args_hash: str
    link: str
    at: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.event}|{self.workflow_id}|{self.step}|{self.args_hash}"

    def body(self, fmt: Format) -> dict[str, Any]:
        if fmt == "json":
            return asdict(self)
        extra = ", ".join(f"{k}: {v}" for k, v in self.details.items() if v not in (None, "", []))
        text = (
            f"[exactcall] {self.event.replace('_', ' ')}: {self.tool} {self.step} in "
            f"{self.workflow_id} (args hash {self.args_hash[:16]}){' - ' + extra if extra else ''}"
            f" <{self.link}|open in the inbox>"
        )
        return {"text": text}


class Webhook:
    """POSTs events; bounded retries; never raises."""

    def __init__(
        self,
        url: str,
        fmt: Format = "json",
        attempts: int = 3,
        timeout: float = 5.0,
        backoff: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--notify-url {url!r}: give an http:// or https:// URL")
        self.url, self.fmt, self.attempts, self.timeout, self.backoff = (
            url,
            fmt,
            attempts,
            timeout,
            backoff,
        )

    def _post(self, data: bytes) -> None:
        req = urllib.request.Request(
            self.url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            resp.read()

    async def send(self, e: Event) -> bool:
        data = json.dumps(e.body(self.fmt)).encode()
        for attempt in range(1, self.attempts + 1):
            try:
                await asyncio.to_thread(self._post, data)
                return True
            except Exception as exc:
                log.warning(
                    "notify %s: attempt %d/%d failed: %s", e.id, attempt, self.attempts, exc
                )
                if attempt < self.attempts:
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
        log.error("notify %s: dropped after %d attempts", e.id, self.attempts)
        return False


class _State:
    """Events already handled and calls being followed, kept in a JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.sent: dict[str, None] = {}
        self.following: dict[str, dict[str, Any]] = {}
        if path is not None and path.exists():
            data = json.loads(path.read_text())
            self.sent = dict.fromkeys(data.get("sent", []))
            self.following = data.get("following", {})

    def save(self) -> None:
        if self.path is None:
            return
        while len(self.sent) > REMEMBERED:
            del self.sent[next(iter(self.sent))]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"sent": list(self.sent), "following": self.following}))
        os.replace(tmp, self.path)


class Notifier:
    """Watches the pending calls and the outcomes of those it saw waiting."""

    def __init__(
        self,
        client: Client,
        webhook: Webhook,
        inbox_url: str,
        state_path: Path | None = None,
        interval: float = 1.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client, self.webhook, self.interval, self.clock = client, webhook, interval, clock
        self.inbox_url = inbox_url.rstrip("/")
        self.state = _State(state_path)
        self._sending: set[asyncio.Task[bool]] = set()
        self._last: dict[str, asyncio.Task[bool]] = {}  # the last event of each call in flight

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # Temporal unreachable for a while: try again
                log.warning("notify: could not read the pending calls: %s", exc)
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        reqs = await list_pending(self.client)
        waiting = {_fid(r.workflow_id, r.step, r.args_hash) for r in reqs}
        for r in reqs:
            self.state.following.setdefault(
                _fid(r.workflow_id, r.step, r.args_hash),
                {
                    "workflow_id": r.workflow_id,
                    "step": r.step,
                    "tool": r.tool,
                    "args_hash": r.args_hash,
                },
            )
            self._emit("approval_requested", r.workflow_id, r.step, r.tool, r.args_hash, _asked(r))
        for fid, c in list(self.state.following.items()):
            if fid not in waiting:
                await self._follow(fid, c)
        self.state.save()

    async def _follow(self, fid: str, c: dict[str, Any]) -> None:
        row = None
        async for r in audit_rows(self.client, AuditFilter(workflow=c["workflow_id"])):
            if r["step"] == c["step"] and r["args_hash"] == c["args_hash"]:
                row = r
                break
        if row is None or row["outcome"] == "pending":
            return  # the listing is ahead of the history, or the run is gone: look again
        decided = {
            "decision": row["outcome"]
            if row["outcome"] in ("denied", "expired", "cancelled")
            else "approved",
            "approved_by": [p.get("name") for p in row["approved_by"]],
            "denied_by": (row["denied_by"] or {}).get("name"),
            "reason": row["reason"],
        }
        self._emit(
            "approval_decided", c["workflow_id"], c["step"], c["tool"], c["args_hash"], decided
        )
        if row["outcome"] not in UNSETTLED:
            settled = {"outcome": row["outcome"], "error": row["error"]}
            self._emit(
                "call_settled", c["workflow_id"], c["step"], c["tool"], c["args_hash"], settled
            )
            del self.state.following[fid]

    def _emit(
        self, kind: Any, wf: str, step: str, tool: str, h: str, details: dict[str, Any]
    ) -> None:
        link = self.inbox_url + (
            "/call?" + urlencode({"wf": wf, "step": step})
            if kind == "approval_requested"
            else "/run?" + urlencode({"wf": wf})
        )
        e = Event(kind, wf, step, tool, h, link, self.clock().isoformat(), details)
        if e.id in self.state.sent:
            return
        self.state.sent[e.id] = None
        # never awaited by the watch loop; a call's events go out in the order they happened
        # (decided before settled), each after the one before it for the same call
        fid = _fid(wf, step, h)
        task = asyncio.create_task(self._send_after(self._last.get(fid), e))
        self._last[fid] = task
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(lambda t: self._forget(fid, t))

    def _forget(self, fid: str, task: asyncio.Task[bool]) -> None:
        if self._last.get(fid) is task:
            del self._last[fid]

    async def _send_after(self, before: asyncio.Task[bool] | None, e: Event) -> bool:
        if before is not None:
            await asyncio.wait({before})
        return await self.webhook.send(e)

    async def drain(self, timeout: float = 10) -> None:
        """Wait for the events in flight (at shutdown)."""
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=timeout)


def _fid(wf: str, step: str, h: str) -> str:
    return f"{wf}|{step}|{h}"


def _asked(r: ApprovalRequest) -> dict[str, Any]:
    return {
        "requested_by": r.requested_by,
        "expires_at": r.expires_at.isoformat(),
        "approvals_needed": r.approvals_needed,
        "reasons": list(r.reasons),
    }
