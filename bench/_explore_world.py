"""The world of ``bench/explore.py``: a dev server, the bank, two worker processes behind
fault proxies, and the operations a schedule is made of, with the checks after each.

An operation is a dict: ``{"op": NAME, "wf": i, ...}`` (the workflow it acts on) or
``{"op": NAME, "worker": j, ...}`` (the worker), and ``"wait"``: seconds to let pass after
it. Operations that make no sense at that moment (approving a workflow that is not running)
do nothing and say so in the log; only the checks decide a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

import exactcall
from bench import _explore_workflows as ew
from exactcall import approvals, reconciliation
from exactcall._canonical import derive_key
from exactcall._wire import reconcile_id
from exactcall.demo.bank import Bank
from exactcall.reconciliation._verdicts import Settled
from exactcall.testing import FaultProxy, WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
MODULE = "bench._explore_workflows"
APPROVED_STEP = "ex_approved#1"
CRASH_POINTS = ("in_call", "after_call", "after_record")


@dataclass
class World:
    """Everything a schedule acts on; one per explorer process, shared by its schedules
    (each schedule has workflow ids of its own)."""

    client: Client
    address: str
    bank: Bank
    tq: str = field(default_factory=lambda: f"explore-{uuid.uuid4().hex[:8]}")
    workers: list[WorkerProcess | None] = field(default_factory=list)
    proxies: list[FaultProxy] = field(default_factory=list)
    armed: set[int] = field(default_factory=set)
    held: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    gone: list[WorkerProcess] = field(default_factory=list)
    on_start: Callable[[int], None] = lambda pid: None
    """Told each worker's pid (the bench's watchdog)."""
    deaths: list[int] = field(default_factory=list)
    """Exit codes of the workers that died by themselves: -9 at a crash point, 75 a fail-stop."""

    async def start(self, n: int = 2) -> None:
        self.proxies = [FaultProxy(self.address) for _ in range(n)]
        self.workers = [None] * n
        await asyncio.gather(*(self.respawn(j) for j in range(n)))

    async def respawn(self, j: int, crash_at: str | None = None) -> None:
        old = self.workers[j]
        if old is not None:
            self.gone.append(old)
            old.stop()
        wp = WorkerProcess(
            self.proxies[j].address,
            self.tq,
            tools=[MODULE],
            workflows=[MODULE],
            crash_at=crash_at,
            cwd=ROOT,
            name=f"explore-w{j}",
        )
        self.workers[j] = wp
        self.on_start(wp.proc.pid)
        self.armed.discard(j)
        if crash_at:
            self.armed.add(j)
        await wp.started()

    async def reap(self) -> None:
        """Start a worker (unarmed) in the place of one that died (its crash point, or a
        fail-stop), as a supervisor would."""
        for j, wp in enumerate(self.workers):
            if j not in self.held and (wp is None or wp.proc.poll() is not None):
                if wp is not None:
                    self.deaths.append(wp.proc.returncode)
                await self.respawn(j)

    async def heal(self) -> None:
        """End every freeze and partition, replace armed and dead workers: a quiet world."""
        for task in list(self.held.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reap()
        for j in list(self.armed):
            await self.respawn(j)

    def stop(self) -> None:
        for wp in [*self.workers, *self.gone]:
            if wp is not None:
                with contextlib.suppress(ProcessLookupError):
                    if wp.proc.poll() is None:
                        wp.thaw()
                wp.stop()
        for p in self.proxies:
            p.close()


@dataclass
class Run:
    """One schedule's state: its workflows and what the explorer did to them."""

    world: World
    tag: str
    n_wf: int
    pause: float = 0.3
    approved: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Workflow id -> the hashes it was sent approvals of (for the approval tool's step)."""
    terminated: set[str] = field(default_factory=set)
    resolved: set[tuple[str, str]] = field(default_factory=set)
    started: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def wid(self, i: int) -> str:
        return f"{self.tag}-w{i}"

    def job(self, i: int) -> dict[str, Any]:
        return {"bank": self.world.bank.url, "account": self.wid(i), "pause": self.pause}

    def exact_hash(self, i: int) -> str:
        j = self.job(i)
        return exactcall.intent_hash(
            "ex_approved", bank=j["bank"], amount=4, to=j["account"], pause=j["pause"]
        )

    # -- operations ----------------------------------------------------------------------
    async def do(self, op: dict[str, Any]) -> None:
        name = op["op"]
        await self.world.reap()
        try:
            said = await getattr(self, f"op_{name.replace('-', '_')}")(op)
        except (RPCError, LookupError, RuntimeError, TimeoutError) as exc:
            said = f"did nothing: {type(exc).__name__}: {str(exc)[:120]}"
        self.log.append(f"{name} {op.get('wf', op.get('worker', ''))}: {said or 'ok'}")
        await asyncio.sleep(op.get("wait", 0.0))

    async def op_start(self, op: dict[str, Any]) -> str:
        """Start the workflow; a re-run of the same id if its last run has closed."""
        wid = self.wid(op["wf"])
        try:
            await self.world.client.start_workflow(
                ew.AGENT, self.job(op["wf"]), id=wid, task_queue=self.world.tq
            )
        except WorkflowAlreadyStartedError:
            return "running already"
        rerun = wid in self.started
        self.started.add(wid)
        self.terminated.discard(wid)
        return "re-run of the same id" if rerun else "started"

    async def op_kill(self, op: dict[str, Any]) -> str:
        j = op["worker"]
        wp = self.world.workers[j]
        if wp is None or j in self.world.held:
            return "did nothing: worker held"
        wp.kill()
        await self.world.respawn(j)
        return f"SIGKILLed pid {wp.proc.pid}"

    async def op_crash(self, op: dict[str, Any]) -> str:
        """Replace the worker with one that SIGKILLs itself at a crash point."""
        j = op["worker"]
        if j in self.world.held:
            return "did nothing: worker held"
        rule = f"{op['tool']}:{op['point']}:1"
        await self.world.respawn(j, crash_at=rule)
        return f"armed {rule}"

    async def op_freeze(self, op: dict[str, Any]) -> str:
        return self._hold(op, "freeze")

    async def op_partition(self, op: dict[str, Any]) -> str:
        return self._hold(op, "partition")

    def _hold(self, op: dict[str, Any], kind: str) -> str:
        j = op["worker"]
        wp = self.world.workers[j]
        if wp is None or j in self.world.held or wp.proc.poll() is not None:
            return "did nothing: worker held or dead"
        proxy = self.world.proxies[j]

        async def hold() -> None:
            try:
                if kind == "freeze":
                    wp.freeze()
                else:
                    proxy.mode = "blackhole"
                await asyncio.sleep(op["seconds"])
            finally:
                if kind == "freeze":
                    with contextlib.suppress(ProcessLookupError):
                        wp.thaw()
                else:
                    proxy.mode = "pass"
                self.world.held.pop(j, None)

        self.world.held[j] = asyncio.ensure_future(hold())
        return f"{kind} for {op['seconds']:.1f} s"

    async def op_terminate(self, op: dict[str, Any]) -> str:
        wid = self.wid(op["wf"])
        await self.world.client.get_workflow_handle(wid).terminate("explorer")
        self.terminated.add(wid)
        return "terminated"

    async def op_rollover(self, op: dict[str, Any]) -> str:
        await self.world.client.get_workflow_handle(self.wid(op["wf"])).signal(ew.ROLLOVER)
        return "continue-as-new asked"

    async def op_reset(self, op: dict[str, Any]) -> str:
        """Reset the workflow's current run to a random completed workflow task of it."""
        wid = self.wid(op["wf"])
        handle = self.world.client.get_workflow_handle(wid)
        desc = await handle.describe()
        done = [
            e.event_id
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ]
        if not done:
            return "did nothing: no completed workflow task"
        event = done[int(op["at"] * len(done)) % len(done)]
        await self.world.client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=self.world.client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=wid, run_id=desc.run_id),
                reason="explorer",
                workflow_task_finish_event_id=event,
                request_id=uuid.uuid4().hex,
            )
        )
        self.terminated.discard(wid)
        return f"reset to event {event} of {len(done)} tasks"

    async def op_approve(self, op: dict[str, Any]) -> str:
        return await self._decide(op, "approve", self.exact_hash(op["wf"]))

    async def op_double_approve(self, op: dict[str, Any]) -> str:
        h = self.exact_hash(op["wf"])
        a = await self._decide(op, "approve", h)
        return f"{a}; {await self._decide(op, 'approve', h)}"

    async def op_approve_wrong(self, op: dict[str, Any]) -> str:
        """Approve a hash of other arguments (the amount 5): must not let the call run."""
        j = self.job(op["wf"])
        wrong = exactcall.intent_hash(
            "ex_approved", bank=j["bank"], amount=5, to=j["account"], pause=j["pause"]
        )
        return await self._decide(op, "approve", wrong, record=False)

    async def op_deny(self, op: dict[str, Any]) -> str:
        return await self._decide(op, "deny", self.exact_hash(op["wf"]), record=False)

    async def _decide(self, op: dict[str, Any], verdict: str, h: str, record: bool = True) -> str:
        wid = self.wid(op["wf"])
        send = approvals.approve if verdict == "approve" else approvals.deny
        if record:  # noted before it is sent: a signal whose answer is lost may still land
            self.approved[wid].append(h)
        res = await send(
            self.world.client, wid, APPROVED_STEP, args_hash=h, by="explorer", confirm_timeout=3
        )
        return f"{verdict}: {res.outcome}"

    async def op_resolve(self, op: dict[str, Any]) -> str:
        """A person resolves the workflow's parked calls, truthfully: landed (with the bank's
        receipt) if the bank has the payment, else not landed."""
        wid = self.wid(op["wf"])
        said = []
        for row in await reconciliation.list_unresolved(self.world.client):
            if row.workflow_id != wid:
                continue
            amount = dict(ew.STEPS)[row.step.split("#")[0]]
            paid = [p for p in self.world.bank.payments() if _is(p, wid, amount)]
            if paid:
                receipt = {"payment_id": paid[0]["id"], "amount": amount, "to": wid}
                res = await reconciliation.resolve(
                    self.world.client, wid, row.step, "landed", result=receipt, by="explorer"
                )
            else:
                res = await reconciliation.resolve(
                    self.world.client, wid, row.step, "not_landed", by="explorer"
                )
            self.resolved.add((wid, row.step))
            said.append(f"{row.step} {res.resolution.verdict}: {res.outcome}")
        return "; ".join(said) or "did nothing: nothing parked"

    async def op_undo(self, op: dict[str, Any]) -> str:
        """``exactcall undo <workflow id> --yes`` (the undo of what its last run did)."""
        cmd = [sys.executable, "-m", "exactcall", "undo", self.wid(op["wf"]), "--yes"]
        cmd += ["--wait", "10", "--address", self.world.address]
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace").strip().replace("\n", " | ")
        return f"exit {proc.returncode}: {text[-200:]}"

    # -- checks --------------------------------------------------------------------------
    def safety(self) -> list[str]:
        """At most one effect per (workflow id, step) and per undo; no effect of the approval
        tool without an approval of exactly its hash."""
        found = []
        count: dict[tuple[str, int], int] = defaultdict(int)
        for p in self.world.bank.payments():
            if p["to_account"].startswith(f"{self.tag}-"):
                count[(p["to_account"], p["amount"])] += 1
        for (acct, amount), n in sorted(count.items()):
            if n > 1:
                found.append(f"{n} payments to {acct} of {amount} (one (workflow id, step))")
        for i in range(self.n_wf):
            wid = self.wid(i)
            if count.get((wid, 4)) and self.exact_hash(i) not in self.approved.get(wid, []):
                found.append(f"{wid} {APPROVED_STEP} paid without an approval of its hash")
        return found

    async def liveness(self, wait: float) -> list[str]:
        """Once quiet: every started, not terminated workflow ends, each call with exactly one
        outcome (done with its payment and not parked; unknown and parked with a reason, or
        resolved by the explorer; denied without a payment), none lost."""
        found = []
        for wid in sorted(self.started - self.terminated):
            handle = self.world.client.get_workflow_handle(wid)
            try:
                rows = await _result(self, handle, wait)
            except Exception as exc:
                found.append(f"{wid}: its run did not end ({type(exc).__name__}: {exc})"[:300])
                continue
            found += await self._outcomes(wid, rows)
        return found

    async def _outcomes(self, wid: str, rows: list[dict[str, Any]]) -> list[str]:
        found = []
        parked = {
            r.step: r.reason
            for r in await reconciliation.list_unresolved(self.world.client)
            if r.workflow_id == wid
        }
        paid = {p["amount"]: p["id"] for p in self.world.bank.payments() if p["to_account"] == wid}
        if [r["step"] for r in rows] != [f"{t}#1" for t, _ in ew.STEPS]:
            found.append(f"{wid}: calls {[r['step'] for r in rows]}, not one row per call")
        for r in rows:
            where, out = f"{wid} {r['step']}", r["outcome"]
            if out == "done" and (r["payment_id"] != paid.get(r["amount"]) or r["step"] in parked):
                found.append(f"{where}: done, receipt {r['payment_id']}, bank {paid}, {parked}")
            elif out == "unknown" and not parked.get(r["step"]):
                if (wid, r["step"]) not in self.resolved and not await self._settled(wid, r):
                    found.append(f"{where}: unknown, but neither parked with a reason nor settled")
            elif out == "denied" and r["amount"] in paid:
                found.append(f"{where}: denied, but the bank has its payment")
            elif out == "error":
                found.append(f"{where}: ended in an error: {r.get('error')}: {r.get('reason')}")
        return found

    async def _settled(self, wid: str, row: dict[str, Any]) -> bool:
        """Whether the call's reconciliation ended with a verdict (the explorer's, or a late
        attempt's result: exactcall settles a parked call as landed by it); logged."""
        tool = exactcall.get_tool(row["tool"])
        key = derive_key(self.world.client.namespace, wid, row["step"], tool.name, tool.version)
        handle = self.world.client.get_workflow_handle(reconcile_id(key), result_type=Settled)
        try:
            desc = await handle.describe()
        except RPCError:
            self.log.append(f"check {wid} {row['step']}: no reconciliation")
            return False
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            self.log.append(f"check {wid} {row['step']}: reconciliation {desc.status}, not parked")
            return False
        s = await handle.result()
        self.log.append(f"check {wid} {row['step']}: settled {s.verdict} by {s.decided_by}")
        return True


def _is(p: dict[str, Any], wid: str, amount: int) -> bool:
    return bool(p["to_account"] == wid and p["amount"] == amount)


async def _result(run: Run, handle: Any, wait: float) -> list[dict[str, Any]]:
    """The workflow's result, approving its pending call with the exact hash and resolving
    its parked calls truthfully every few seconds while it waits (the person who comes by at
    the end: a call whose probe said "not landed" again after a re-run waits for one); raises
    if it does not end within ``wait``."""
    deadline = time.monotonic() + wait
    i = int(handle.id.rsplit("-w", 1)[1])
    asked = 0.0
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            rows: list[dict[str, Any]] = await handle.result()
            return rows
        if time.monotonic() > deadline:
            raise TimeoutError(f"still running after {wait:.0f} s")
        if time.monotonic() - asked > 3:
            asked = time.monotonic()
            pending = await approvals.list_pending(run.world.client)
            if any(r.workflow_id == handle.id for r in pending):
                await run.do({"op": "approve", "wf": i})
            parked = await reconciliation.list_unresolved(run.world.client)
            if any(r.workflow_id == handle.id for r in parked):
                await run.do({"op": "resolve", "wf": i})
        await asyncio.sleep(0.5)
