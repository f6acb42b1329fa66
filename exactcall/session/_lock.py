"""One live process per session: the session's lock workflow and the lease its holder runs.

The lock is a workflow (id ``session_id_prefix(session)``) on the session's task queue. A
process that opens the session asks it (update ``exactcall.session.acquire``, with start);
the lock grants it when nobody holds it, and then runs the activity ``exactcall.session.hold``
on that process's own task queue: the activity heartbeats every ``BEAT`` while the process
lives, and the lock is held for as long as it runs. A process that exits releases it (update
``exactcall.session.release``, which cancels the activity); one that dies (SIGKILL) stops
heartbeating, and its hold ends ``LEASE`` later. A second process asking while a live one
holds the session waits up to ``ACQUIRE_WAIT`` (long enough for a dead holder's lease to run
out) and is then refused with ``SessionBusy``, saying which process holds it.

The workflow ends once nobody holds it (the next process starts a new run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from exactcall._model import FROZEN
from exactcall._wire import (
    SESSION_HOLD_ACTIVITY,
    SESSION_LOCK_ACQUIRE_UPDATE,
    SESSION_LOCK_RELEASE_UPDATE,
    SESSION_LOCK_WORKFLOW,
)

__all__ = ["ACQUIRE_WAIT", "BEAT", "LEASE", "Holder", "SessionLock", "hold", "on_hold_lost"]

LEASE = timedelta(seconds=4)
"""How long after its last heartbeat a holder that went quiet (killed) loses the session."""
BEAT = 0.5
"""How often the holding process heartbeats (seconds)."""
ACQUIRE_WAIT = LEASE * 2 + timedelta(seconds=4)
"""How long an open waits for the holder's lease to run out before it is refused (the lease,
then the lock's next task, which first waits out the dead holder's sticky queue)."""
SESSION_BUSY = "SessionBusy"


class Holder(BaseModel):
    """The process that holds a session."""

    model_config = FROZEN

    owner: str
    """A fresh id per open of the session."""
    task_queue: str
    """Where its hold activity runs (its own task queue)."""
    pid: int
    host: str
    since: str

    def text(self) -> str:
        return f"process {self.pid} on {self.host} (since {self.since})"


@workflow.defn(name=SESSION_LOCK_WORKFLOW, sandboxed=False)  # pure code over exactcall's models
class SessionLock:
    """Which process holds one session."""

    def __init__(self) -> None:
        self._holder: Holder | None = None
        self._hold: asyncio.Task[None] | None = None

    @workflow.run
    async def run(self, session: str) -> None:
        while True:
            await workflow.wait_condition(
                lambda: self._holder is not None or workflow.all_handlers_finished()
            )
            h = self._holder
            if h is None:
                return  # nobody holds it or asks for it
            self._hold = asyncio.ensure_future(self._run_hold(h))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._hold
            if self._holder is h:
                self._holder = None

    @staticmethod
    async def _run_hold(h: Holder) -> None:
        await workflow.execute_activity(
            SESSION_HOLD_ACTIVITY,
            h.owner,
            task_queue=h.task_queue,
            schedule_to_start_timeout=LEASE,
            start_to_close_timeout=timedelta(days=3650),
            heartbeat_timeout=LEASE,
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=f"held by {h.text()}",
        )

    @workflow.update(name=SESSION_LOCK_ACQUIRE_UPDATE)
    async def acquire(self, h: Holder) -> Holder:
        """Grant the session to ``h``, once nobody else holds it (a dead holder's lease runs
        out meanwhile); refuse with SessionBusy when a live one still holds it."""
        deadline = workflow.now() + ACQUIRE_WAIT
        while self._holder is not None and self._holder.owner != h.owner:
            left = deadline - workflow.now()
            try:
                if left <= timedelta(0):
                    raise TimeoutError
                await workflow.wait_condition(lambda: self._holder is None, timeout=left)
            except TimeoutError:
                held = self._holder
                raise ApplicationError(
                    f"session is in use by {held.text() if held else 'another process'}: one "
                    "live process at a time. Close it there first (or wait for it to exit).",
                    held.model_dump() if held else {},
                    type=SESSION_BUSY,
                    non_retryable=True,
                ) from None
        self._holder = h
        return h

    @workflow.update(name=SESSION_LOCK_RELEASE_UPDATE)
    def release(self, owner: str) -> bool:
        """The holder closed the session (True if it held it)."""
        if self._holder is None or self._holder.owner != owner:
            return False
        self._holder = None
        if self._hold is not None:
            self._hold.cancel()
        return True


_LOST: dict[str, Callable[[], None]] = {}


def on_hold_lost(owner: str, callback: Callable[[], None] | None) -> None:
    """Call ``callback`` when this process's hold of ``owner`` ends other than by release
    (its lease ran out: the session may now be another process's). None: forget it."""
    if callback is None:
        _LOST.pop(owner, None)
    else:
        _LOST[owner] = callback


@activity.defn(name=SESSION_HOLD_ACTIVITY)
async def hold(owner: str) -> None:
    """Heartbeat while this process lives; ends when the lock releases it (cancelled)."""
    try:
        while True:
            activity.heartbeat()
            await asyncio.sleep(BEAT)
    except asyncio.CancelledError:
        pass  # released, or this worker stops: the hold ends (no failure to report)
    finally:
        lost = _LOST.pop(owner, None)  # still registered: not released by this process
        if lost is not None:
            lost()
