"""The fleet of ``bench/soak.py``: the worker processes and the approval bot.

Each worker slot runs ``exactcall worker`` for ``bench._soak_workflows``. With
``partitions=True`` every slot reaches the server through a :class:`FaultProxy` of its own
(kept across restarts), which can cut it off. The faults the fleet can take: SIGKILL (the
slot is restarted), SIGSTOP of the process group for some seconds (a freeze), and a blackhole
between the worker and the frontend for some seconds (a partition). A worker that stops
itself (exactcall's fail-stop, after a freeze or a partition) is restarted by :meth:`reap`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

import exactcall
from bench import _soak_workflows as wf
from bench._soak_count import Fault
from exactcall import approvals
from exactcall.testing import FaultProxy, WorkerProcess

MIN_UPTIME_S = 1.0
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Fleet:
    """The worker processes, and the faults they take (each one logged in ``faults``)."""

    address: str
    task_queue: str
    workers: int
    env: dict[str, str]
    sticky_timeout: float
    plugins: list[str] = field(default_factory=list)
    partitions: bool = False
    on_start: Callable[[int], None] = lambda pid: None
    slots: list[WorkerProcess | None] = field(default_factory=list)
    gone: list[WorkerProcess] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    fail_stops: list[dict[str, Any]] = field(default_factory=list)
    restarts: set[asyncio.Task[None]] = field(default_factory=set)
    up_since: dict[int, float] = field(default_factory=dict)
    proxies: list[FaultProxy] = field(default_factory=list)
    held: set[int] = field(default_factory=set)
    """Slots frozen or cut off right now (no second fault lands on them)."""

    def _spawn(self, i: int) -> WorkerProcess:
        module = "bench._soak_workflows"
        wp = WorkerProcess(
            self.proxies[i].address if self.partitions else self.address,
            self.task_queue,
            tools=[module],
            workflows=[module],
            plugins=[f"{module}:plugins", *self.plugins],
            cwd=ROOT,
            env=self.env,
            sticky_timeout=self.sticky_timeout,
            name=f"soak-w{i}",
        )
        self.on_start(wp.proc.pid)
        return wp

    async def start(self, i: int, tries: int = 20) -> None:
        """Start worker ``i``; it takes its slot once it polls (a failed start is retried: a
        start during a server outage fails)."""
        for _ in range(tries):
            wp = self._spawn(i)
            try:
                self.slots[i] = await wp.started()
                self.up_since[i] = time.monotonic()
                return
            except (RuntimeError, TimeoutError) as exc:
                error = str(exc)[-400:]
                print(f"  worker {i} did not start, starting another: {error}", flush=True)
                wp.stop()
        raise RuntimeError(f"worker {i} did not start {tries} times; last: {error}")

    async def start_all(self) -> None:
        if self.partitions and not self.proxies:
            self.proxies = [FaultProxy(self.address) for _ in range(self.workers)]
        self.slots = [None] * self.workers
        await asyncio.gather(*(self.start(i) for i in range(self.workers)))

    def _restart(self, i: int) -> None:
        task = asyncio.ensure_future(self.start(i))
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)

    def pick(self, rng: random.Random) -> int | None:
        """A live worker that is not frozen or cut off, one up for a while if there is one
        (a worker faulted as it comes up runs nothing)."""
        live = [i for i, wp in enumerate(self.slots) if wp is not None and i not in self.held]
        older = [i for i in live if time.monotonic() - self.up_since[i] >= MIN_UPTIME_S]
        return rng.choice(older or live) if live else None

    def kill_one(self, rng: random.Random) -> Fault | None:
        """SIGKILL a worker and start another in its slot."""
        i = self.pick(rng)
        if i is None:
            return None
        wp = self.slots[i]
        assert wp is not None
        self.slots[i] = None
        fault = Fault("worker", time.time(), wp.proc.pid, i)
        wp.kill()
        self.gone.append(wp)
        self.faults.append(fault)
        self._restart(i)
        return fault

    def hold_one(self, kind: str, rng: random.Random, seconds: float) -> Fault | None:
        """Freeze a worker (SIGSTOP) or cut it off (blackhole), for ``seconds``."""
        i = self.pick(rng)
        if i is None:
            return None
        wp = self.slots[i]
        assert wp is not None
        fault = Fault(kind, time.time(), wp.proc.pid, i, until=time.time() + seconds)
        self.held.add(i)
        if kind == "freeze":
            wp.freeze()
        else:
            self.proxies[i].mode = "blackhole"
        self.faults.append(fault)
        task = asyncio.ensure_future(self._heal(kind, i, wp, fault, seconds))
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)
        return fault

    async def _heal(self, kind: str, i: int, wp: WorkerProcess, fault: Fault, s: float) -> None:
        await asyncio.sleep(s)
        if kind == "freeze":
            with contextlib.suppress(ProcessLookupError):
                wp.thaw()
        else:
            self.proxies[i].mode = "pass"
        fault.until = time.time()
        self.held.discard(i)

    def reap(self) -> None:
        """Restart the slots whose worker exited by itself (a fail-stop)."""
        for i, wp in enumerate(self.slots):
            if wp is not None and i not in self.held and wp.proc.poll() is not None:
                self.fail_stops.append(
                    {"t": time.time(), "pid": wp.proc.pid, "worker": i, "exit": wp.proc.returncode}
                )
                self.slots[i] = None
                self.gone.append(wp)
                self._restart(i)

    async def settle(self) -> None:
        """Wait for the heals and restarts in progress (every slot is live afterwards)."""
        while self.restarts:
            await asyncio.gather(*list(self.restarts))
            self.reap()

    def stop(self) -> None:
        for wp in [*self.slots, *self.gone]:
            if wp is not None:
                with contextlib.suppress(ProcessLookupError):
                    wp.thaw() if wp.proc.poll() is None else None
                wp.stop()
        for proxy in self.proxies:
            proxy.close()


@dataclass
class ApprovalBot:
    """Approves every pending ``soak_approved`` call of this soak's runs (workflow ids that start
    with ``tag``) with its exact hash, as a person would after reading it: the hash it sends is
    recomputed here from the arguments it was shown. Others' pending calls on a shared server
    are left alone."""

    client: Client
    tag: str
    sent: set[tuple[str, str]] = field(default_factory=set)
    approved: int = 0
    refused: list[str] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll ``list_pending`` until ``stop``; then wait for the approvals being sent."""
        while not stop.is_set():
            try:
                rows = await approvals.list_pending(self.client)
            except (RPCError, RuntimeError):  # the server away (a server fault): poll again
                rows = []
            for req in rows:
                if not req.workflow_id.startswith(f"{self.tag}-"):
                    continue  # another program's call (a shared server): not the soak's to decide
                if (req.workflow_id, req.step) not in self.sent:
                    self.sent.add((req.workflow_id, req.step))
                    task = asyncio.ensure_future(self._approve(req))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _approve(self, req: Any) -> None:
        mine = exactcall.intent_hash(req.tool, **req.args)
        if req.tool != wf.APPROVED or mine != req.args_hash:
            self.refused.append(f"{req.workflow_id} {req.step}: hash {req.args_hash} != {mine}")
            return
        try:
            await approvals.approve(
                self.client,
                req.workflow_id,
                req.step,
                args_hash=mine,
                by="soak-bot",
                confirm_timeout=2.0,
            )
            self.approved += 1
        except Exception:  # not sent or not confirmed (the server away): the next poll lists
            # it again if it is still pending (a second approval of one hash changes nothing)
            self.sent.discard((req.workflow_id, req.step))
