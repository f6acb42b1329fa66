"""``exactcall demo``: the same payment, with and without exactcall, five ways side by side.

Five scenarios run at once, each on a fresh task queue with its own accounts at a local demo
bank. In the first four a worker process (A) is killed with SIGKILL right after the payment
and a second worker (B) takes over:

* a plain Temporal activity: the retry pays again (2 payments);
* exactcall with a destination that dedupes the key (``pay``): re-sent with the same key, the
  bank replays its receipt (1 payment, done);
* exactcall with a probe (``pay_probed``): the retry finds the outcome unknown, the call's
  reconciliation asks the bank for its key and finds it landed (1 payment, reconciled);
* exactcall with neither (``pay_no_key``, ``on_unknown="raise"``): not re-sent, the agent hears
  at once that the outcome is unknown and the call is parked for a person, listed by
  ``exactcall unresolved`` until ``exactcall resolve`` settles it (1 payment). It is left
  parked.

The fifth runs on one healthy worker: ``approved_pay(10, alice)`` waits for a person, the demo
approves its exact hash and it runs; the agent then asks for ``approved_pay(9999, mallory)``,
the same approval sent to that call is rejected (hash mismatch), and the demo denies it
(1 payment).

It uses the Temporal server given by the connection flags (default localhost:7233), or starts
the embedded dev server when none answers. Everything it starts is stopped when it ends, except
the parked call on a server of your own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle

from exactcall import approvals, reconciliation
from exactcall._canonical import derive_key
from exactcall._crash import CRASH_ENV
from exactcall._plugin import Plugin
from exactcall._worker import Connection, connect
from exactcall.activities._runs import run_claim_id
from exactcall.demo.bank import Bank
from exactcall.dev._procs import WorkerProcess
from exactcall.embedded._server import DevServer
from exactcall.workflows import record_id

__all__ = ["run_demo"]

T = TypeVar("T")

CONNECT_TIMEOUT = 2.0
WORKER_START_TIMEOUT = 60.0
CRASH_TIMEOUT = 60.0
RESULT_TIMEOUT = 30.0
POLL_TIMEOUT = 30.0
QUERY_TIMEOUT = 10.0
AMOUNT = 10
CHANGED_AMOUNT = 9999
APPROVER = "demo"
TOOL_VERSION = "1"  # the demo's tools keep the default version (part of their keys)
TOOLS_MODULE = "exactcall.demo.tools"
WORKFLOWS_MODULE = "exactcall.demo.workflows"
CRASH_BARE_ENV = "EXACTCALL_DEMO_CRASH_BARE"  # exactcall.demo.tools.CRASH_BARE_ENV
RESOLVE_FLAGS = "--landed --result JSON|--not-landed|--abandon"


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    workflow: str
    tool: str | None
    crash_env: dict[str, str]
    """Environment of worker A, which is SIGKILLed by it; empty: one healthy worker."""
    expect_payments: int
    expect_status: str
    on_unknown: str | None = None


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
        key="probe",
        label="exactcall (crash inside, with a probe)",
        workflow="PaymentAgent",
        tool="pay_probed",
        crash_env={CRASH_ENV: "pay_probed:after_call"},
        expect_payments=1,
        expect_status="reconciled",
    ),
    Scenario(
        key="parked",
        label="exactcall (crash inside, no probe)",
        workflow="PaymentAgent",
        tool="pay_no_key",
        crash_env={CRASH_ENV: "pay_no_key:after_call"},
        expect_payments=1,
        expect_status="parked",
        on_unknown="raise",
    ),
    Scenario(
        key="approval",
        label="exactcall (approval of exact args)",
        workflow="ApprovalAgent",
        tool="approved_pay",
        crash_env={},
        expect_payments=1,
        expect_status="denied",
    ),
)


class Unexpected(Exception):
    """A scenario went off its script (the message says how)."""


@dataclass
class Outcome:
    scenario: Scenario
    account: str
    payments: int | None = None
    requests: int | None = None
    status: str | None = None
    detail: str = ""
    error: str | None = None
    lines: list[str] = field(default_factory=list)
    """Printed under the scenario's row when it went as expected."""

    @property
    def as_expected(self) -> bool:
        return not self.differences()

    def note(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        sc = self.scenario
        if not self.as_expected:
            return f"{self.status}: {self.detail}" if self.detail else str(self.status)
        if sc.key == "plain":
            return "paid twice: the retry sent it again"
        if sc.key == "dedupe":
            if self.requests is not None and self.requests >= 2:
                return "done: re-sent with the same key, the bank replayed it"
            return "done: paid once"
        if sc.key == "probe":
            return "reconciled: landed by the probe, not re-sent"
        if sc.key == "parked":
            return "unknown: not re-sent, unresolved (waits for a person)"
        if sc.key == "approval":
            return "the approved call paid; the changed one was rejected, then denied"
        return str(self.status)

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
        """Connection flags beyond address and namespace."""
        args: list[str] = []
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


def spawn_worker(
    name: str, target: Target, task_queue: str, extra_env: dict[str, str]
) -> WorkerProcess:
    """``exactcall worker`` for the demo's tools and workflows, in a child process."""
    return WorkerProcess(
        target.address,
        task_queue,
        namespace=target.namespace,
        tools=[TOOLS_MODULE],
        workflows=[WORKFLOWS_MODULE],
        name=name,
        args=target.worker_args(),
        env=target.worker_env(extra_env),
        inherit_env=False,
    )


async def wait_killed(wp: WorkerProcess) -> None:
    try:
        await wp.killed(CRASH_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(
            f"worker {wp.name} was not killed within {CRASH_TIMEOUT:.0f} s (did the payment run?)"
        ) from None


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
        wp = spawn_worker(name, self.target, task_queue, env)
        self.workers.append(wp)
        return wp

    async def scenario(self, sc: Scenario) -> Outcome:
        outcome = Outcome(sc, f"alice-{self.run_id}-{sc.key}")
        try:
            if sc.crash_env:
                await self._crash(sc, outcome)
            else:
                await self._approval(sc, outcome)
        except Exception as exc:
            outcome.error = _describe(exc)
        return outcome

    async def _start(
        self, sc: Scenario, args: list[Any], workflow_id: str, task_queue: str
    ) -> WorkflowHandle[Any, Any]:
        assert self.client is not None
        handle = await self.client.start_workflow(
            sc.workflow,
            args=args,
            id=workflow_id,
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=10),
            result_type=dict,
        )
        self.handles.append(handle)
        return handle

    def _leave_nothing(
        self, workflow_id: str, tool: str, calls: int
    ) -> list[WorkflowHandle[Any, Any]]:
        """On a server that outlives the demo, cleanup also ends the run claim of
        ``workflow_id``, and the call records (and the reconciliations) of its calls: they are
        served by the demo's workers only."""
        assert self.client is not None and self.target is not None
        if self.target.embedded:
            return []
        added = [self.client.get_workflow_handle(run_claim_id(workflow_id))]
        for n in range(1, calls + 1):
            key = derive_key(self.target.namespace, workflow_id, f"{tool}#{n}", tool, TOOL_VERSION)
            for wid in (record_id(key), reconciliation.reconcile_id(key)):
                added.append(self.client.get_workflow_handle(wid))
        self.handles += added
        return added

    def _rows(self, *accounts: str) -> list[dict[str, Any]]:
        assert self.bank is not None
        return [row for account in accounts for row in self.bank.store.payments(None, account)]

    async def _crash(self, sc: Scenario, outcome: Outcome) -> None:
        """Worker A is killed right after the payment; worker B takes over."""
        assert self.client is not None and self.bank is not None and self.target is not None
        suffix = uuid.uuid4().hex[:12]
        task_queue = f"exactcall-demo-{sc.key}-{suffix}"
        workflow_id = f"exactcall-demo-{sc.key}-{suffix}"
        args: list[Any] = [self.bank.url, AMOUNT, outcome.account]
        if sc.tool is not None:
            args.append(sc.tool)
        if sc.on_unknown is not None:
            args.append(sc.on_unknown)
        call = self._leave_nothing(workflow_id, sc.tool, 1) if sc.tool is not None else []

        a = await self.spawn(f"{sc.key}-A", task_queue, sc.crash_env)
        try:
            await a.started(WORKER_START_TIMEOUT)
            handle = await self._start(sc, args, workflow_id, task_queue)
            await wait_killed(a)
        except Exception:
            _explain(a)
            raise
        self.say(f"  {sc.label}: worker killed right after the payment; a new one takes over")

        b = await self.spawn(f"{sc.key}-B", task_queue, {})
        try:
            await b.started(WORKER_START_TIMEOUT)
            try:
                result: dict[str, Any] = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
            except TimeoutError:
                raise TimeoutError(
                    f"the workflow did not finish within {RESULT_TIMEOUT:.0f} s"
                ) from None
            outcome.status = str(result.get("status"))
            outcome.detail = str(result.get("reason") or "")
            rows = await asyncio.to_thread(self._rows, outcome.account)
            # B runs the call's reconciliation too (on the workflow's task queue)
            if sc.key == "probe" and outcome.status == "done":
                await self._check_reconciled(outcome, result, rows)
            if sc.key == "parked" and outcome.status == "unknown":
                await self._check_parked(outcome, workflow_id, task_queue)
                # parked as it should be: left for `exactcall resolve` on a server of your own
                self.handles = [h for h in self.handles if h not in call]
        except Exception:
            _explain(b)
            raise
        finally:
            b.stop()

        rows = await asyncio.to_thread(self._rows, outcome.account)
        outcome.payments = len(rows)
        outcome.requests = sum(int(r["request_count"]) for r in rows)

    async def _check_reconciled(
        self, outcome: Outcome, result: dict[str, Any], rows: list[dict[str, Any]]
    ) -> None:
        """Done after a crash inside the call: ask the reconciliation who decided, and how."""
        assert self.client is not None
        keys = [r["idempotency_key"] for r in rows if r["idempotency_key"]]
        if not keys:
            outcome.detail = "the bank has no payment under the call's key"
            return
        rid = reconciliation.reconcile_id(keys[0])
        try:
            st = await asyncio.wait_for(reconciliation.state(self.client, rid), QUERY_TIMEOUT)
        except Exception as exc:
            raise Unexpected(f"the reconciliation {rid} did not answer: {_describe(exc)}") from exc
        settled = st.settled
        if settled is None:
            outcome.detail = f"the reconciliation is {st.phase}"
        elif (settled.verdict, settled.decided_by) != ("landed", "probe"):
            outcome.detail = f"settled by {settled.decided_by}: {settled.verdict}"
        elif (result.get("receipt") or {}).get("found_by") != "probe":
            outcome.detail = "the result is not the probe's"
        else:
            outcome.status = "reconciled"

    async def _check_parked(self, outcome: Outcome, workflow_id: str, task_queue: str) -> None:
        """Unknown at once: the call must be listed as parked (visibility is eventual). Its
        reconciliation parks it: a worker must serve the task queue until it is listed."""
        assert self.client is not None and self.target is not None
        client = self.client

        async def listed() -> list[reconciliation.UnresolvedCall]:
            rows = await reconciliation.list_unresolved(client)
            return [r for r in rows if r.workflow_id == workflow_id]

        rows = await _poll(listed, bool, POLL_TIMEOUT, "the call was not listed as parked")
        row = rows[0]
        outcome.status = "parked"
        outcome.lines.append(
            f"unresolved; `exactcall resolve {row.workflow_id} {row.step} {RESOLVE_FLAGS}` "
            "resolves it"
        )
        if self.target.embedded:
            outcome.lines.append("(it ends with the embedded server; on yours it stays unresolved)")
        else:
            outcome.lines.append(
                f"(a worker must serve it: exactcall worker --task-queue {task_queue} "
                f"--tools {TOOLS_MODULE} --workflows {WORKFLOWS_MODULE})"
            )

    async def _approval(self, sc: Scenario, outcome: Outcome) -> None:
        """Approve the exact call; the agent changes it; the same approval must not fit."""
        assert self.client is not None and self.bank is not None
        client = self.client
        suffix = uuid.uuid4().hex[:12]
        task_queue = f"exactcall-demo-{sc.key}-{suffix}"
        workflow_id = f"exactcall-demo-{sc.key}-{suffix}"
        mallory = f"mallory-{self.run_id}-{sc.key}"
        args = [self.bank.url, AMOUNT, outcome.account, CHANGED_AMOUNT, mallory]

        async def waiting() -> approvals.ApprovalRequest:
            return await asyncio.wait_for(approvals.pending(client, workflow_id), QUERY_TIMEOUT)

        if sc.tool is not None:
            self._leave_nothing(workflow_id, sc.tool, 2)
        w = await self.spawn(sc.key, task_queue, {})
        try:
            await w.started(WORKER_START_TIMEOUT)
            handle = await self._start(sc, args, workflow_id, task_queue)
            first = await _poll(waiting, bool, POLL_TIMEOUT, "no call waited for approval")
            yes = await approvals.approve(
                client, workflow_id, first.step, args_hash=first.args_hash, by=APPROVER
            )
            if not yes.accepted:
                raise Unexpected(f"approving {first.step} was not accepted: {yes.outcome}")
            self.say(
                f"  {sc.label}: pay({AMOUNT}, alice) waited for a person; approved as "
                f"{APPROVER!r} (hash {first.args_hash[:12]})"
            )
            second = await _poll(
                waiting,
                lambda r: r.step != first.step,
                POLL_TIMEOUT,
                "the changed call did not wait for approval",
            )
            paid_first = len(await asyncio.to_thread(self._rows, outcome.account))
            # the approval of pay(10, alice), sent as it was to the new call
            same = await approvals.approve(
                client, workflow_id, second.step, args_hash=first.args_hash, by=APPROVER
            )
            view = await asyncio.wait_for(approvals.view(client, workflow_id), QUERY_TIMEOUT)
            still_pending = second.step in [p.step for p in view.pending]
            self.say(
                f"  {sc.label}: the model changed it to pay({CHANGED_AMOUNT}, mallory); the "
                f"same approval: {_short(same.outcome)}"
            )
            no = await approvals.deny(
                client,
                workflow_id,
                second.step,
                args_hash=second.args_hash,
                by=APPROVER,
                reason="not what was approved",
            )
            try:
                result: dict[str, Any] = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
            except TimeoutError:
                raise TimeoutError(
                    f"the workflow did not finish within {RESULT_TIMEOUT:.0f} s"
                ) from None
        except Exception:
            _explain(w)
            raise
        finally:
            w.stop()

        rows = await asyncio.to_thread(self._rows, outcome.account, mallory)
        outcome.payments = len(rows)
        outcome.requests = sum(int(r["request_count"]) for r in rows)
        outcome.status = str(result.get("status"))
        outcome.detail = str(result.get("reason") or "")
        script = [
            (paid_first == 1, f"the approved call made {paid_first} payment(s), not 1"),
            (
                second.args.get("amount") == CHANGED_AMOUNT and second.args.get("to") == mallory,
                f"the second call waiting for approval is {second.args}",
            ),
            (
                not same.accepted and same.outcome.startswith("hash mismatch"),
                f"the approval of the first call, sent to the changed one: {same.outcome}",
            ),
            (still_pending, "the changed call did not stay pending after the rejected approval"),
            (no.accepted, f"denying the changed call: {no.outcome}"),
        ]
        wrong = [why for ok, why in script if not ok]
        if wrong:
            outcome.status, outcome.detail = "off script", "; ".join(wrong)
            return
        outcome.lines.append(
            f"yes to pay({AMOUNT}, alice) -> paid; the model changed it to "
            f"pay({CHANGED_AMOUNT}, mallory) -> that yes was rejected (hash mismatch); "
            "denied, nothing ran"
        )

    # -- report -----------------------------------------------------------------------------
    def report(self, outcomes: Sequence[Outcome], seconds: float) -> int:
        width = max(len(o.scenario.label) for o in outcomes)
        self.say()
        for o in outcomes:
            count = "?" if o.payments is None else str(o.payments)
            self.say(f"  {o.scenario.label:<{width}}  payments: {count:<3} {o.note()}")
            if o.as_expected:
                for line in o.lines:
                    self.say(f"      {line}")
        self.say()
        differences = [d for o in outcomes for d in o.differences()]
        for d in differences:
            self.say(f"unexpected: {d}")
        if differences:
            self.say()
        self.say(f"finished in {seconds:.1f} s")
        if self.keep and self.bank is not None:
            self.say(
                f"bank database: {self.bank.db_path} (accounts alice-{self.run_id}-*, "
                f"mallory-{self.run_id}-*)"
            )
        return 1 if differences else 0

    # -- cleanup ----------------------------------------------------------------------------
    async def cleanup(self) -> None:
        for wp in self.workers:
            wp.stop()
        if self.server is None and self.client is not None:
            # a server that outlives the demo: end the demo's unfinished workflows, and its
            # calls' records, which no worker will serve (not the parked call: it is left for
            # `exactcall resolve`)
            await asyncio.gather(*(_terminate(h) for h in self.handles))
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


async def _terminate(handle: WorkflowHandle[Any, Any]) -> None:
    with contextlib.suppress(Exception):  # already closed, or never started
        await asyncio.wait_for(handle.terminate(reason="the exactcall demo is over"), 5)


async def _poll(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float, failure: str
) -> T:
    """``fn()`` until ``ok`` of its value (errors count as not yet); TimeoutError past
    ``timeout`` seconds, with ``failure`` and the last error as its message."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: str | None = None
    while True:
        try:
            value = await fn()
        except Exception as exc:
            last = _describe(exc)
        else:
            if ok(value):
                return value
        if loop.time() > deadline:
            raise TimeoutError(
                f"{failure} within {timeout:.0f} s" + (f" (last error: {last})" if last else "")
            )
        await asyncio.sleep(0.1)


def _short(text: str) -> str:
    """``hash mismatch: the pending call's args hash is ...`` -> ``rejected (hash mismatch)``."""
    head = text.split(":", 1)[0]
    return f"rejected ({head})" if head == "hash mismatch" else text


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return msg[0] if msg else type(exc).__name__


def _explain(wp: WorkerProcess) -> None:
    """Show the end of a worker's log when its scenario went wrong."""
    if wp.tail:
        print(f"--- last log lines of worker {wp.name} ---", file=sys.stderr)
        for line in wp.tail[-5:]:
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
            f'exactcall demo: pay({AMOUNT}, "alice") five ways at once; in the first four the '
            "worker is killed with SIGKILL right after the payment"
        )
        demo.say()
        outcomes = await asyncio.gather(*(demo.scenario(sc) for sc in SCENARIOS))
        return demo.report(outcomes, time.monotonic() - started)
    finally:
        await demo.cleanup()
