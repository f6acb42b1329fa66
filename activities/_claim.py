"""An attempt's claim to run, as its worker can see it.

The server keeps an attempt while it hears it: each heartbeat it records starts the attempt's
``heartbeat_timeout`` again; past that it times the attempt out, and a successor may take the
call over. A worker cannot see that moment, but it can bound it from its side. A heartbeat
acknowledged by the server was recorded after it was sent, so the server cannot time the
attempt out before ``sent + heartbeat_timeout``. The attempt therefore *holds its claim* until

    last acknowledged heartbeat's send time + heartbeat_timeout - margin

by a clock that also counts time the process did not run (``CLOCK_BOOTTIME``: a SIGSTOP, a GC
pause, a suspended VM). Past it the claim is *lost*: the server may have handed the call on.
A worker cut off from the server loses it on time; a frozen one finds it lost the moment it
runs again (its clock moved on while it slept). Nothing about the server's answers is trusted
beyond the acknowledgement itself.

What a lost claim does (``_cancelling.Cancellation.claim_lost``): an async tool is cancelled;
a sync tool cannot be, so the worker stops its own process (fail-stop, ``os._exit``) unless the
tool's late effect is harmless (provider-idempotent) or ``Plugin(fail_stop=False)``. A tool
may ask before an irreversible step: ``exactcall.check_claim()`` (sync tools) and
``await exactcall.check_claim_async()`` raise NotExecuted when the claim is lost, after a
heartbeat round trip that proves it held a moment ago.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from temporalio.client import AsyncActivityCancelledError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._errors import ExactcallError, NotExecuted

__all__ = ["Claim", "check_claim", "check_claim_async", "claim_margin", "clock", "holding"]

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def clock() -> float:
    """Seconds, monotonic, counting time the process was stopped or the machine suspended."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


def claim_margin(heartbeat_timeout: float) -> float:
    """How much earlier than the server a worker gives its claim up: a tenth of the heartbeat
    timeout, between 0.1 s and 1 s (room to cancel the tool before the server's own deadline,
    which a successor then waits out with the retry's back-off)."""
    return min(1.0, max(0.1, heartbeat_timeout / 10))


@dataclass
class Claim:
    """One attempt's claim: when it was last acknowledged, and whether it is lost."""

    heartbeat_timeout: float
    acked_at: float = field(default_factory=clock)
    """Send time of the last heartbeat the server acknowledged (the attempt's start before)."""
    lost: str | None = None
    """Why the claim was lost, once it was."""
    check: Callable[[], Awaitable[None]] | None = None
    """A synchronous heartbeat of the attempt (set by the attempt): raises if it is refused."""
    loop: asyncio.AbstractEventLoop | None = None

    @property
    def limit(self) -> float:
        return self.heartbeat_timeout - claim_margin(self.heartbeat_timeout)

    @property
    def expires_at(self) -> float:
        return self.acked_at + self.limit

    def acked(self, sent_at: float) -> None:
        self.acked_at = max(self.acked_at, sent_at)

    def expired(self) -> bool:
        """Lost by time (and noted so): no acknowledgement for the claim's limit."""
        if self.lost is None and clock() >= self.expires_at:
            self.lost = (
                f"no heartbeat acknowledged for {clock() - self.acked_at:.1f}s (heartbeat "
                f"timeout {self.heartbeat_timeout:g}s): the server may have handed the call on"
            )
        return self.lost is not None

    async def verify(self) -> float:
        """A heartbeat round trip; NotExecuted unless the claim still holds. Returns how many
        seconds it holds at least."""
        self._raise_if_lost()
        if self.check is not None:
            sent = clock()
            try:
                await self.check()
            except AsyncActivityCancelledError as exc:
                if exc.details is None or not exc.details.cancel_requested:
                    self.lost = self.lost or f"the server refused the attempt's heartbeat ({exc})"
                    self._raise_if_lost()
                self.acked(sent)  # recorded: the claim holds, but the call was cancelled
                raise NotExecuted(
                    "the workflow cancelled the call: the tool must not make its effect"
                ) from None
            except Exception as exc:
                if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                    # timed out, or its run closed: handed on for sure
                    self.lost = self.lost or f"the server no longer knows the attempt ({exc})"
                    self._raise_if_lost()
                # not proven, not lost either (a blip): the watchdog still goes by the clock
                raise NotExecuted(
                    f"the attempt's claim to run could not be proven ({exc}); the tool must "
                    "not make its effect now"
                ) from None
            self.acked(sent)
        self._raise_if_lost()
        return self.expires_at - clock()

    def _raise_if_lost(self) -> None:
        if self.expired():
            raise NotExecuted(
                f"this attempt lost its claim to run ({self.lost}); the tool must not make "
                "its effect: another attempt may be running the call"
            )


_CURRENT: contextvars.ContextVar[Claim | None] = contextvars.ContextVar(
    "exactcall_claim", default=None
)


@contextmanager
def holding(claim: Claim) -> Iterator[None]:
    """The running tool's claim (its task or thread copies this context)."""
    token = _CURRENT.set(claim)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _current() -> Claim:
    claim = _CURRENT.get()
    if claim is None:
        raise ExactcallError(
            "no exactcall tool call is running here: check_claim() works only inside a tool "
            "that runs through exactcall.call"
        )
    return claim


def check_claim(timeout: float | None = None) -> float:
    """From a sync tool, right before an irreversible step: raise NotExecuted unless this
    attempt still holds its claim to run (a heartbeat round trip to the server proves it), or
    when the workflow cancelled the call.

    Returns how many seconds the claim holds at least. What remains: a pause of the process
    between this check and the effect itself; only a provider that dedupes on the key closes
    that window.

    Args:
        timeout: how long to wait for the round trip (default: the claim's remaining time).
    """
    claim = _current()
    loop = claim.loop
    if loop is None:
        claim._raise_if_lost()
        return claim.expires_at - clock()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise ExactcallError("an async tool checks its claim with await check_claim_async()")
    wait = timeout if timeout is not None else max(0.1, claim.expires_at - clock())
    future = asyncio.run_coroutine_threadsafe(claim.verify(), loop)
    try:
        return future.result(wait)
    except TimeoutError:
        future.cancel()
        claim.expired()
        claim._raise_if_lost()
        raise NotExecuted(
            f"this attempt could not prove its claim to run within {wait:.1f}s; the tool "
            "must not make its effect"
        ) from None


async def check_claim_async() -> float:
    """``check_claim`` for an async tool."""
    return await _current().verify()
