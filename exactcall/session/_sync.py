"""``exactcall.session_sync``: a session for code that is not async.

The session (its client, its worker, its lock) lives on an event loop in a thread of its own
for as long as the ``with`` block runs; each call is sent there and waited for.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from temporalio.client import Client

from exactcall._tool import Tool
from exactcall.session._calls import not_in_workflow
from exactcall.session._session import Session

__all__ = ["SessionSync", "session_sync"]

T = TypeVar("T")


def session_sync(
    id: str, *, client: Client | None = None, task_queue: str | None = None
) -> SessionSync:
    """``with exactcall.session_sync("order-42") as s: s.call(pay, 10, "alice")``: the same
    as :func:`exactcall.session`, for sync code. A ``client`` given is used from the
    session's own thread (connect it with ``exactcall.Plugin()``)."""
    return SessionSync(Session(id, client=client, task_queue=task_queue))


class SessionSync:
    """An open sync session: ``call`` blocks until the call has its outcome."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def id(self) -> str:
        return self.session.id

    def __enter__(self) -> SessionSync:
        not_in_workflow("exactcall.session_sync")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"exactcall-session-{self.id}", daemon=True
        )
        self._thread.start()
        try:
            self._run(self.session.__aenter__())
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._run(self.session.__aexit__(*exc))
        finally:
            self._stop()

    def call(self, tool: Tool | str, /, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`Session.call` (``key=``, ``wait=``, ``on_unknown=``), blocking."""
        return self._run(self.session.call(tool, *args, **kwargs))

    def call_with(self, tool: Tool | str, /, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`Session.call_with`, blocking."""
        return self._run(self.session.call_with(tool, *args, **kwargs))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the session is not open: use `with exactcall.session_sync(...)`")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result()

    def _stop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=30)
        if loop is not None and not loop.is_running():
            loop.close()
