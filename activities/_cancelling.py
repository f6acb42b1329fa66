"""How an attempt is cancelled, and how it passes the cancellation on to the tool.

Two sources: the workflow cancels the call (exactcall's own heartbeat, every quarter of the
heartbeat timeout, answers "cancel requested"), or the worker cancels the attempt (its
graceful shutdown is over, or the server timed the attempt out). Either way the tool sees it
once: an async tool gets CancelledError, and ``activity.is_cancelled()`` turns true for a sync
one. What the tool then does decides the outcome: it returns (done), raises NotExecuted (it
did not happen), or anything else (unknown, reconciled).

An attempt that lost its claim to run (``_claim``: the server may have handed the call on;
its worker was cut off, or frozen, or the server timed it out) is cancelled the same way,
and a sync tool of it that still runs stops the worker's process (fail-stop), unless its
late effect is harmless (a provider-idempotent tool) or the plugin says ``fail_stop=False``.

The *settling* attempt (activity id ``exactcall.settle:<id>``) runs after a cancelled
activity ended with no attempt reporting (it had not started, or its worker died): it decides
from the markers alone and never calls the tool (``_decision``, as a cancellation noted by the
time of the call does).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

from exactcall._tool import Tool

__all__ = [
    "BY_SHUTDOWN",
    "BY_WORKFLOW",
    "CLAIM_LOST",
    "FAIL_STOP_EXIT",
    "Cancellation",
    "ToolCancelled",
    "durably",
    "worker_reason",
]

T = TypeVar("T")

BY_WORKFLOW = "the workflow cancelled the call"
BY_SHUTDOWN = "the worker shut down"
TIMED_OUT = "the attempt timed out"
CLAIM_LOST = "the attempt lost its claim to run"
FAIL_STOP_EXIT = 75
"""The exit status of a worker that stopped itself: a sync tool of an attempt whose claim was
lost was still running (EX_TEMPFAIL: a supervisor restarts it)."""


class ToolCancelled(Exception):
    """The tool ended on a cancellation without saying whether its effect happened."""


def worker_reason() -> str:
    """Why the worker cancelled this attempt, from the SDK's cancellation details."""
    d = activity.cancellation_details()
    if d is None or d.worker_shutdown:
        return BY_SHUTDOWN
    if d.cancel_requested:
        return BY_WORKFLOW
    if d.timed_out or d.not_found:
        return TIMED_OUT
    return "the attempt was paused or reset"


async def durably(work: Awaitable[T], on_cancel: Callable[[], None]) -> T:
    """Finish ``work`` even if this attempt is cancelled meanwhile (a marker is never torn
    by the worker's shutdown); ``on_cancel`` notes that it was."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            _uncancel()
            on_cancel()


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class Cancellation:
    """The cancellation state of one attempt, and its delivery to the running tool."""

    def __init__(self, t: Tool, log: Any, *, fail_stop: bool) -> None:
        self.tool = t
        self.log = log
        self.fail_stop = fail_stop
        self.why: str | None = None
        """Why this attempt was cancelled, once it was (BY_WORKFLOW, BY_SHUTDOWN, ...)."""
        self.tool_run: asyncio.Future[Any] | None = None
        self._delivered = False

    @property
    def by_workflow(self) -> bool:
        return self.why == BY_WORKFLOW

    def __call__(self, why: str) -> None:
        """Note a cancellation and deliver it to the running tool (once)."""
        self.note(why)
        run = self.tool_run
        if run is None or self._delivered:
            return
        self._delivered = True
        # an async tool is cancelled now; a sync one sees activity.is_cancelled() when the
        # worker's own heartbeat (sent while the tool runs) brings the cancellation back
        if self.tool.is_async and not run.done():
            run.cancel()

    def note(self, why: str) -> None:
        if self.why is None:
            self.why = why
            self.log.info("tool.cancel_requested", why=why)

    def claim_lost(self, detail: str) -> None:
        """The attempt lost its claim to run: its tool must not go on. An async tool is
        cancelled; a sync one, which nothing can interrupt, stops the process (fail-stop)."""
        run = self.tool_run
        self.log.warning("tool.claim_lost", why=detail, tool_running=run is not None)
        if run is not None and not run.done() and not self.tool.is_async and self._fail_stops:
            self.log.critical(
                "worker.fail_stop",
                why=f"{CLAIM_LOST} ({detail}) while its sync tool still runs: this process "
                "stops before the tool can make a late effect",
                exit_status=FAIL_STOP_EXIT,
            )
            sys.stderr.flush()
            os._exit(FAIL_STOP_EXIT)
        self(f"{CLAIM_LOST}: {detail}")

    @property
    def _fail_stops(self) -> bool:
        """A sync tool whose late effect is not harmless: not read-only, not deduplicated by
        its provider for good."""
        idempotent = self.tool.options.provider_idempotent is True
        return self.fail_stop and not self.tool.attempt_reads and not idempotent

    def by_worker(self) -> None:
        """The worker cancelled this attempt while it wrote a marker (which it finished)."""
        self.note(worker_reason())

    async def outcome(self, run: asyncio.Future[Any]) -> Any:
        """The tool's result or error.

        The worker cancels this attempt when it shuts down (the tool is told, and gets a
        heartbeat timeout's time to answer), when the workflow cancelled the call (the tool is
        told), or when the server no longer knows the attempt (it timed out, or its workflow
        closed: the tool goes on until its claim to run has run out by the worker's clock, see
        ``claim_lost``, and its outcome is recorded for the next attempt to find; a read-only
        tool is told, as on shutdown).
        """
        grace = self.tool.options.heartbeat_timeout.total_seconds()
        self.tool_run = run
        try:
            await self._await_tool(run, grace)
        finally:
            self.tool_run = None
        if not run.done():
            raise ToolCancelled(
                f"the tool was still running {grace:g}s after it was cancelled ({self.why})"
            )
        if run.cancelled():
            raise ToolCancelled(f"the tool stopped on cancellation ({self.why})")
        return run.result()

    async def _await_tool(self, run: asyncio.Future[Any], grace: float) -> None:
        while not run.done():
            try:
                await asyncio.shield(run)
            except asyncio.CancelledError:
                if run.done():
                    return
                _uncancel()
                why = worker_reason()
                if why == BY_SHUTDOWN or self.tool.attempt_reads:
                    self(why)  # a read-only tool has no outcome to record: it stops too
                    await asyncio.wait({run}, timeout=grace)
                    return
                if why == BY_WORKFLOW:
                    self(why)
                else:  # the tool goes on until its claim runs out (``_claim``)
                    self.log.warning("tool.attempt_stale", why=why)
            except Exception:
                return  # the tool's own error: the caller reads it
