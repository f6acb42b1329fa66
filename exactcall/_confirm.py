"""Confirm a signal's outcome by query: the CLI and Python API send, then read it back."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

__all__ = ["confirm_at_terminal", "confirm_by_query"]

S = TypeVar("S")
R = TypeVar("R")


async def confirm_by_query(
    query: Callable[[], Awaitable[S]], find: Callable[[S], R | None], timeout: float
) -> R | None:
    """Query until ``find`` sees the outcome; None if no worker answered in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            answer = await asyncio.wait_for(query(), max(0.5, deadline - loop.time()))
        except (RPCError, TimeoutError, WorkflowQueryFailedError):
            await asyncio.sleep(0.2)
            continue
        found = find(answer)
        if found is not None:
            return found
        await asyncio.sleep(0.05)
    return None


def confirm_at_terminal(
    prompt: str, yes: bool, *, doing: str = "decide", declined: str = "Nothing sent."
) -> int | None:
    """A person's yes before a CLI acts: None to go on; else the exit code (2: no terminal
    and no ``--yes``; 1: the answer was not yes, after printing ``declined``)."""
    if yes:
        return None
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            f"exactcall: refusing to {doing} without a terminal; pass --yes to confirm",
            file=sys.stderr,
        )
        return 2
    answer = input(f"{prompt} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        print(declined)
        return 1
    return None
