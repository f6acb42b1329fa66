"""A ThreadingHTTPServer served in a daemon thread: start, stop, context manager.

Shared by the demo bank and the chaos proxy (stdlib only).
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Self

__all__ = ["ServedHTTP"]


class ServedHTTP:
    """Subclasses set ``host``/``port`` and implement ``_make_server()``."""

    host: str
    port: int
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _url: str | None = None

    def _make_server(self) -> ThreadingHTTPServer:
        raise NotImplementedError

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (only once started)."""
        if self._url is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._url

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> str:
        """Bind, serve in a daemon thread, and return the base URL."""
        if self._server is not None:
            raise RuntimeError(f"{type(self).__name__} is already started")
        server = self._make_server()
        host, port = server.server_address[:2]
        host = str(host)
        self._url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"exactcall-{type(self).__name__.lower()}-{port}",
            daemon=True,
        )
        self._server = server
        self._thread.start()
        return self._url

    def stop(self) -> None:
        """Stop serving and release the socket (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
