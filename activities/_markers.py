"""What one attempt writes: its heartbeats (synchronous, and the liveness loop around slow
work), its record's markers, and, when the outcome is unknown, the start of the call's
reconciliation. It also holds what the attempt is (its tool, intent, chain, claim to run and
cancellation), which the deciding (``_runner``) and the calling (``_calling``) share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import structlog
from temporalio import activity
from temporalio.client import AsyncActivityCancelledError, AsyncActivityHandle
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from exactcall._errors import ExactcallError
from exactcall._model import Intent, Owner, RecordEvent
from exactcall._tool import Tool
from exactcall._wire import SETTLE_PREFIX, undo_id
from exactcall.activities._cancelling import BY_WORKFLOW, Cancellation, durably
from exactcall.activities._claim import Claim, clock
from exactcall.activities._records import Record, RecordView
from exactcall.reconciliation._verdicts import (
    RECONCILE_WORKFLOW,
    reconcile_id,
    reconcile_input,
    reconcile_start_options,
)
from exactcall.undo._undo import is_undo_step

__all__ = ["Markers", "describe"]

log = structlog.get_logger("exactcall")


class Markers:
    """One attempt's markers, and the attempt they belong to."""

    def __init__(self, t: Tool, intent: Intent, *, fail_stop: bool = True) -> None:
        info = activity.info()
        self.tool = t
        self.intent = intent
        self.info = info
        chain = info.activity_id
        self.settling = chain.startswith(SETTLE_PREFIX)
        if self.settling:  # settles the chain of the cancelled activity, from its markers
            chain = chain[len(SETTLE_PREFIX) :]
        self.owner = Owner(run_id=info.workflow_run_id or "", activity_id=chain)
        self.claim = Claim(t.options.heartbeat_timeout.total_seconds())
        """This attempt's claim to run, as its worker sees it (``_claim``)."""
        self.log = log.bind(
            tool=intent.tool,
            step=intent.step,
            key=intent.key,
            workflow_id=intent.workflow_id,
            args_hash=intent.args_hash,
            attempt=info.attempt,
        )
        self.cancel = Cancellation(t, self.log, fail_stop=fail_stop)
        self.handle: AsyncActivityHandle = activity.client().get_async_activity_handle(
            task_token=info.task_token
        )
        self.record = Record(activity.client(), intent)

    @property
    def previous_phase(self) -> str | None:
        details = self.info.heartbeat_details
        if details and isinstance(details[0], dict):
            return details[0].get("phase")
        return None

    @property
    def in_reconciliation(self) -> bool:
        return self.info.workflow_id == reconcile_id(self.intent.key)

    @property
    def in_undo_run(self) -> bool:
        """Made by ``exactcall undo``: an undo of the call's workflow, made in the undo
        workflow of that id (``undo_id``), under the key the workflow's saga would use."""
        i = self.intent
        return is_undo_step(i.step) and self.info.workflow_id == undo_id(i.workflow_id)

    def unchanged_details(self) -> dict[str, Any]:
        """Liveness heartbeats while deciding must not erase what earlier attempts wrote."""
        details = self.info.heartbeat_details
        if details and isinstance(details[0], dict):
            return dict(details[0])
        return {"phase": None}

    def calling(self) -> dict[str, Any]:
        """The pre-call heartbeat's details."""
        return {"phase": "calling", "attempt": self.info.attempt}

    async def beat(
        self, details: dict[str, Any], durable: bool = True, via_worker: bool = True
    ) -> None:
        """A synchronous heartbeat: durable, and refused if this attempt is stale. Its answer
        may say that the workflow cancelled the call (the heartbeat is recorded all the same).

        ``via_worker``: the same details go to the worker's own (throttled, so possibly late)
        heartbeat too, which the worker needs to keep the attempt (it times out attempts that
        do not heartbeat through it). Only for details that a late arrival cannot make less
        careful: "calling" and what follows it, never an earlier attempt's details while
        deciding. ``durable``: finished even if the attempt is cancelled meanwhile (not for
        the liveness loop, which is cancelled when its work is done)."""
        if via_worker:
            activity.heartbeat(details)
        sent = clock()
        beat = self.handle.heartbeat(details)
        try:
            await (durably(beat, self.cancel.by_worker) if durable else beat)
        except AsyncActivityCancelledError as exc:
            if exc.details is not None and not exc.details.cancel_requested:
                raise  # paused or reset by an operator: as before, this attempt ends
            self.claim.acked(sent)  # recorded all the same
            self.cancel(BY_WORKFLOW)
        else:
            self.claim.acked(sent)

    @contextlib.asynccontextmanager
    async def keepalive(
        self, details: dict[str, Any], via_worker: bool = True
    ) -> AsyncIterator[None]:
        interval = max(0.2, self.tool.options.heartbeat_timeout.total_seconds() / 4)

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.beat(details, durable=False, via_worker=via_worker)
                except Exception as exc:  # stale attempt or server away: keep the tool going
                    self.log.warning("tool.heartbeat_failed", error=describe(exc))

        async def watch() -> None:
            """The claim's deadline, checked between heartbeats: a worker cut off from the
            server gives it up on time; a frozen one at once when it runs again (its timers
            are overdue, and this one is due before any the tool set for later)."""
            while not self.claim.expired():
                await asyncio.sleep(max(0.0, min(interval / 2, self.claim.expires_at - clock())))
            self.cancel.claim_lost(self.claim.lost or "")

        tasks = [asyncio.create_task(loop()), asyncio.create_task(watch())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def mark(self, kind: str, **fields: Any) -> None:
        ev = RecordEvent(kind=kind, owner=self.owner, attempt=self.info.attempt, **fields)  # type: ignore[arg-type]
        await durably(self.record.mark(ev), self.cancel.by_worker)

    async def done(self, value: Any, unserializable: str | None = None) -> None:
        try:
            await self.mark("done", result=value, unserializable=unserializable)
        except Exception:
            # keep the result in this chain's heartbeat so the next attempt can record it
            await self.beat({"phase": "done", "result": value, "unserializable": unserializable})
            raise

    async def read(self) -> RecordView | None:
        """The key's record, heartbeating meanwhile with what earlier attempts wrote."""
        async with self.keepalive(self.unchanged_details(), via_worker=False):
            return await self.record.read(claimant=False)

    async def must_read(self) -> RecordView:
        view = await self.record.read(claimant=False)
        if view is None:
            raise ExactcallError(f"the record of key {self.intent.key} cannot be read")
        return view

    async def unknown(self, reason: str) -> None:
        self.log.error("tool.ambiguous", reason=reason)
        try:
            await self.mark("unknown", reason=reason)
        except Exception as exc:
            self.log.error("tool.record_unreachable", error=describe(exc))
        await self._route(reason)

    async def _route(self, reason: str) -> None:
        """Start the call's reconciliation now: the call is routed as soon as its outcome is
        known to be unknown, not at the calling workflow's next task (which may wait out a
        dead worker's sticky queue first). The workflow then finds it running and joins it;
        if this start fails, the workflow starts it (as before)."""
        if self.in_reconciliation:
            return  # a re-run inside the reconciliation itself
        inp = reconcile_input(self.tool, self.intent, reason, datetime.now(UTC))
        options = reconcile_start_options(inp, cancelled=self.cancel.by_workflow or self.settling)
        start = activity.client().start_workflow(RECONCILE_WORKFLOW, inp, **options)
        try:
            await durably(start, self.cancel.by_worker)
        except WorkflowAlreadyStartedError:
            pass  # an earlier attempt or run started it
        except Exception as exc:
            self.log.warning("tool.reconcile_start_deferred", error=describe(exc))

    def fields(self, **extra: Any) -> dict[str, Any]:
        i = self.intent
        return {
            "tool": i.tool,
            "step": i.step,
            "key": i.key,
            "workflow_id": i.workflow_id,
            "args_hash": i.args_hash,
            **extra,
        }


def describe(exc: BaseException) -> str:
    msg = exc.message if isinstance(exc, ApplicationError) else str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
