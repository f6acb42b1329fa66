"""``exactcall demo``: the same payment, a worker killed right after it, with and without exactcall.

Three scenarios run side by side, each on a fresh task queue with its own account at a local
demo bank, each with a worker process (A) that is killed with SIGKILL right after the payment
and a second worker (B) that takes over:

* a plain Temporal activity: the retry pays again (2 payments);
* exactcall with a destination that dedupes the key: re-sent with the same key, the bank
  replays its receipt (1 payment, done);
* exactcall with a destination that cannot dedupe: not re-sent, the outcome is reported as
  unknown (1 payment, ``AmbiguousOutcome``).

It uses the Temporal server given by the connection flags (default localhost:7233), or starts
the embedded dev server when none answers. Everything it starts is stopped when it ends.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from exactcall._crash import CRASH_ENV
from exactcall._plugin import Plugin
from exactcall._server import DevServer
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank

__all__ = ["run_demo"]

CONNECT_TIMEOUT = 2.0
WORKER_START_TIMEOUT = 60.0
CRASH_TIMEOUT = 60.0
RESULT_TIMEOUT = 30.0
AMOUNT = 10
TOOLS_MODULE = "exactcall.demo.tools"
WORKFLOWS_MODULE = "exactcall.demo.workflows"
CRASH_BARE_ENV = "EXACTCALL_DEMO_CRASH_BARE"  # exactcall.demo.tools.CRASH_BARE_ENV
STDERR_LINE_LIMIT = 1 << 20
TAIL_LINES = 20


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    workflow: str
    tool: str | None
    crash_env: dict[str, str]
    expect_payments: int
    expect_status: str


SCENARIOS = (
    Scenario(
        key="plain",
        label="plain Temporal activity",
        workflow="BarePaymentAgent",
        tool=None,
        crash_env={CRASH_BARE_ENV: "1"},
        expect_payments=2,
        expect_status="done",
    ),
    Scenario(
        key="dedupe",
        label="exactcall (bank dedupes the key)",
        workflow="PaymentAgent",
        tool="pay",
        crash_env={CRASH_ENV: "pay:after_call"},
        expect_payments=1,
        expect_status="done",
    ),
    Scenario(
        key="unknown",
        label="exactcall (crash inside the call)",
        workflow="PaymentAgent",
        tool="pay_no_key",
        crash_env={CRASH_ENV: "pay_no_key:after_call"},
        expect_payments=1,
        expect_status="unknown",
    ),
)


@dataclass
class Outcome:
    scenario: Scenario
    account: str
    payments: int | None = None
    requests: int | None = None
    status: str | None = None
    detail: str = ""
    error: str | None = None

    @property
    def as_expected(self) -> bool:
        sc = self.scenario
        return (
            self.error is None
            and self.payments == sc.expect_payments
            and self.status == sc.expect_status
        )

    def note(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        sc = self.scenario
        if sc.key == "plain" and self.payments == 2:
            return "paid twice: the retry sent it again"
        if sc.key == "dedupe" and self.status == "done" and self.payments == 1:
            if self.requests is not None and self.requests >= 2:
                return "done: re-sent with the same key, the bank replayed it"
            return "done: paid once"
        if sc.key == "unknown" and self.status == "unknown" and self.payments == 1:
            return "unknown: not re-sent (AmbiguousOutcome)"
        return f"{self.status}: {self.detail}" if self.detail else str(self.status)

    def differences(self) -> list[str]:
        if self.error is not None:
            return [f"{self.scenario.label}: {self.error}"]
        out = []
        sc = self.scenario
        if self.payments != sc.expect_payments:
            out.append(
                f"{sc.label}: expected {sc.expect_payments} payment(s), the bank has "
                f"{self.payments}"
            )
        if self.status != sc.expect_status:
            out.append(
                f"{sc.label}: expected status {sc.expect_status!r}, got {self.status!r}"
                + (f" ({self.detail})" if self.detail else "")
            )
        return out


@dataclass(frozen=True)
class Target:
    """Where the workers connect, as ``exactcall worker`` flags and environment."""

    address: str
    namespace: str
    embedded: bool
    conn: Connection

    def worker_args(self) -> list[str]:
        args = ["--address", self.address, "--namespace", self.namespace]
        if self.embedded:
            return args
        if self.conn.tls:
            args.append("--tls")
        for flag, path in (
            ("--tls-cert", self.conn.tls_cert),
            ("--tls-key", self.conn.tls_key),
            ("--tls-ca", self.conn.tls_ca),
        ):
            if path is not None:
                args += [flag, str(path)]
        return args

    def worker_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.pop(CRASH_ENV, None)
        env.pop(CRASH_BARE_ENV, None)
        if self.embedded:
            # the embedded server is plain local gRPC: no profile API key or TLS applies
            for name in [n for n in env if n.startswith("TEMPORAL_")]:
                del env[name]
        elif self.conn.api_key:
            env["TEMPORAL_API_KEY"] = self.conn.api_key  # not on the command line
        env["EXACTCALL_LOG_LEVEL"] = "INFO"  # the demo waits for "worker.started"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env


class WorkerProcess:
    """``exactcall worker`` in a child process, its stderr drained into a short tail."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._drain: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(
        cls, name: str, target: Target, task_queue: str, extra_env: dict[str, str]
    ) -> WorkerProcess:
        cmd = [
            sys.executable,
            "-m",
            "exactcall",
            "worker",
            *target.worker_args(),
            "--task-queue",
            task_queue,
            "--tools",
            TOOLS_MODULE,
            "--workflows",
            WORKFLOWS_MODULE,
            "--sticky-timeout",
            "1",
        ]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=target.worker_env(extra_env),
            start_new_session=True,  # Ctrl-C is the demo's to handle; it kills the workers
            limit=STDERR_LINE_LIMIT,
        )
        return cls(name, proc)

    async def _readline(self) -> bytes:
        assert self.proc.stderr is not None
        try:
            return await self.proc.stderr.readline()
        except ValueError:  # a line over the limit: take a chunk of it
            return await self.proc.stderr.read(STDERR_LINE_LIMIT)

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if text:
            self.tail.append(text)

    async def started(self, timeout: float = WORKER_START_TIMEOUT) -> None:
        """Wait for the worker's ``worker.started`` log line, then keep draining stderr."""

        async def wait() -> None:
            while True:
                line = await self._readline()
                if not line:
                    code = await self.proc.wait()
                    raise RuntimeError(
                        f"worker {self.name} exited with {code} before it started: "
                        + (self.tail[-1] if self.tail else "no output")
                    )
                self._keep(line)
                if b"worker.started" in line:
                    return

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"worker {self.name} did not start within {timeout:.0f} s") from None
        self._drain = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        while line := await self._readline():
            self._keep(line)

    async def died(self, timeout: float = CRASH_TIMEOUT) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"worker {self.name} was not killed within {timeout:.0f} s (did the payment run?)"
            ) from None

    def kill(self) -> None:
        if self.proc.returncode is None:
            # os.kill, not Process.kill: Popen.send_signal polls first and may reap a worker
            # that just died under asyncio's child watcher (which then warns)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(BaseException):
                await self._drain


@dataclass
class Demo:
    conn: Connection
    keep: bool
    out: Any = field(default_factory=lambda: sys.stdout)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    tmp: Path | None = None
    server: DevServer | None = None
    bank: Bank | None = None
    client: Client | None = None
    target: Target | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    handles: list[WorkflowHandle[Any, Any]] = field(default_factory=list)
    _executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="exactcall-demo"
        )
    )
    _server_start: concurrent.futures.Future[Any] | None = None

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # -- setup ------------------------------------------------------------------------------
    async def find_server(self) -> None:
        kw = self.conn.connect_kwargs()
        address = str(kw["target_host"])
        namespace = str(kw.get("namespace") or "default")
        try:
            self.client = await asyncio.wait_for(connect(self.conn), CONNECT_TIMEOUT)
        except Exception:
            pass
        else:
            self.target = Target(address, namespace, embedded=False, conn=self.conn)
            return
        assert self.tmp is not None
        self.server = DevServer(
            fast=True,
            headless=True,
            db=self.tmp / "temporal.db",
            namespaces=[namespace] if namespace != "default" else (),
        )
        # started in a thread we can wait for on cleanup, even if this await is cancelled
        self._server_start = self._executor.submit(self.server.start)
        await asyncio.wrap_future(self._server_start)
        self.say(
            f"No Temporal server at {address}: started the embedded one on {self.server.address}"
        )
        self.client = await Client.connect(
            self.server.address, namespace=namespace, plugins=[Plugin()]
        )
        self.target = Target(self.server.address, namespace, embedded=True, conn=self.conn)

    def start_bank(self) -> None:
        assert self.tmp is not None
        self.bank = Bank(self.tmp / "bank.db")
        self.bank.start()

    # -- scenarios --------------------------------------------------------------------------
    async def spawn(self, name: str, task_queue: str, env: dict[str, str]) -> WorkerProcess:
        assert self.target is not None
        wp = await WorkerProcess.spawn(name, self.target, task_queue, env)
        self.workers.append(wp)
        return wp

    async def scenario(self, sc: Scenario) -> Outcome:
        account = f"alice-{self.run_id}-{sc.key}"
        outcome = Outcome(sc, account)
        try:
            await self._play(sc, outcome)
        except Exception as exc:
            outcome.error = _describe(exc)
        return outcome

    async def _play(self, sc: Scenario, outcome: Outcome) -> None:
        assert self.client is not None and self.bank is not None
        suffix = uuid.uuid4().hex[:12]
        task_queue = f"exactcall-demo-{sc.key}-{suffix}"
        workflow_id = f"exactcall-demo-{sc.key}-{suffix}"
        args: list[Any] = [self.bank.url, AMOUNT, outcome.account]
        if sc.tool is not None:
            args.append(sc.tool)

        a = await self.spawn(f"{sc.key}-A", task_queue, sc.crash_env)
        try:
            await a.started()
            handle = await self.client.start_workflow(
                sc.workflow,
                args=args,
                id=workflow_id,
                task_queue=task_queue,
                execution_timeout=timedelta(minutes=10),
                result_type=dict,
            )
            self.handles.append(handle)
            await a.died()
        except Exception:
            _explain(a)
            raise
        self.say(f"  {sc.label}: worker killed right after the payment; a new one takes over")

        b = await self.spawn(f"{sc.key}-B", task_queue, {})
        try:
            await b.started()
            try:
                result: dict[str, Any] = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
            except TimeoutError:
                raise TimeoutError(
                    f"the workflow did not finish within {RESULT_TIMEOUT:.0f} s"
                ) from None
        except Exception:
            _explain(b)
            raise
        finally:
            await b.close()

        rows = await asyncio.to_thread(self.bank.store.payments, None, outcome.account)
        outcome.payments = len(rows)
        outcome.requests = sum(int(r["request_count"]) for r in rows)
        outcome.status = str(result.get("status"))
        outcome.detail = str(result.get("reason") or "")

    # -- report -----------------------------------------------------------------------------
    def report(self, outcomes: Sequence[Outcome], seconds: float) -> int:
        width = max(len(o.scenario.label) for o in outcomes)
        self.say()
        for o in outcomes:
            count = "?" if o.payments is None else str(o.payments)
            self.say(f"  {o.scenario.label:<{width}} payments: {count:<3} {o.note()}")
        self.say()
        differences = [d for o in outcomes for d in o.differences()]
        for d in differences:
            self.say(f"unexpected: {d}")
        if differences:
            self.say()
        self.say(f"finished in {seconds:.1f} s")
        if self.keep and self.bank is not None:
            self.say(f"bank database: {self.bank.db_path} (accounts alice-{self.run_id}-*)")
        return 1 if differences else 0

    # -- cleanup ----------------------------------------------------------------------------
    async def cleanup(self) -> None:
        for wp in self.workers:
            wp.kill()
        for wp in self.workers:
            await wp.close()
        if self.server is None and self.client is not None:
            # a server that outlives the demo: end the demo's unfinished workflows
            for handle in self.handles:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        handle.terminate(reason="exactcall demo ended before it finished"), 5
                    )
        if self.bank is not None:
            self.bank.stop()
        if self._server_start is not None:
            with contextlib.suppress(Exception):
                self._server_start.result(timeout=60)
        if self.server is not None:
            self.server.stop()
        self._executor.shutdown(wait=False)
        if self.tmp is not None and not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return msg[0] if msg else type(exc).__name__


def _explain(wp: WorkerProcess) -> None:
    """Show the end of a worker's log when its scenario went wrong."""
    if wp.tail:
        print(f"--- last log lines of worker {wp.name} ---", file=sys.stderr)
        for line in list(wp.tail)[-5:]:
            print(line if len(line) <= 400 else line[:400] + " ...", file=sys.stderr)
        sys.stderr.flush()


async def run_demo(conn: Connection, keep: bool = False) -> int:
    """Run the demo; 0 when every scenario ended as expected, 1 otherwise."""
    started = time.monotonic()
    demo = Demo(conn, keep, tmp=Path(tempfile.mkdtemp(prefix="exactcall-demo-")))
    try:
        await demo.find_server()
        demo.start_bank()
        demo.say(
            f'exactcall demo: pay({AMOUNT}, "alice"), worker killed with SIGKILL right after '
            "the payment"
        )
        demo.say()
        outcomes = await asyncio.gather(*(demo.scenario(sc) for sc in SCENARIOS))
        return demo.report(outcomes, time.monotonic() - started)
    finally:
        await demo.cleanup()
