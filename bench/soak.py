"""Fleet soak: agent runs on worker processes that are SIGKILLed at random, all the time.

    python bench/soak.py                       # 300 runs, 3 workers, Temporal's defaults
    python bench/soak.py --tuned               # sticky 1 s, heartbeat 2 s, task timeout 2 s
    python bench/soak.py --runs 30 --json /tmp/soak.json

Three ``exactcall worker`` processes serve one task queue on one dev server. Each run is a
``SoakAgent`` (``bench/_soak_workflows.py``) making four calls: a plain tool, a
provider-idempotent one, one that needs approval (given by a bot through
``exactcall.approvals`` with the exact hash) and one with a probe. Every 2-5 s a random live
worker gets SIGKILL and is restarted, until every run has finished. Effects are counted at the
demo bank (a real local HTTP service): each run pays its own account, each call a distinct
amount, so a duplicate is a second payment for one (account, amount).

Printed and written as JSON (``--json``): runs, calls, kills, duplicates, lost (a call that
neither finished nor ended parked with its reason, listed by ``exactcall unresolved``),
unknown (parked), and settle p50/p95: the seconds from the SIGKILL of a worker that was running
an attempt of a call to that call settled (done, or unknown and routed to its reconciliation),
read from the agent's history; also the seconds to the agent getting the outcome. Exit 1 on a
duplicate or a lost call. Nothing is asserted on time. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/soak.py` puts only bench/ there
    sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

import exactcall  # noqa: E402
from bench import _soak_workflows as wf  # noqa: E402
from bench._soak_count import Kill, print_report, read_agents, read_attempts, tally  # noqa: E402
from exactcall import approvals, reconciliation  # noqa: E402
from exactcall._tool import ToolOptions  # noqa: E402
from exactcall.demo.bank import Bank  # noqa: E402
from exactcall.testing import WorkerProcess  # noqa: E402

TEMPORAL_STICKY_DEFAULT_S = 10.0  # Worker(sticky_queue_schedule_to_start_timeout=) default
DEFAULT_HEARTBEAT_S = ToolOptions.__dataclass_fields__["heartbeat_timeout"].default.total_seconds()
MIN_UPTIME_S = 1.0
ORDERS = [list(wf.TOOLS[i:] + wf.TOOLS[:i]) for i in range(len(wf.TOOLS))]


@dataclass
class SoakConfig:
    runs: int = 300
    workers: int = 3
    concurrency: int = 30
    kill_every: tuple[float, float] = (2.0, 5.0)
    sticky_timeout: float = TEMPORAL_STICKY_DEFAULT_S
    heartbeat: float | None = None  # None: exactcall's default for the tools
    task_timeout: float | None = None  # the agents' workflow task timeout (None: Temporal's)
    pause_ms: int = 200
    start_every: float = 0.0  # seconds between run starts (0: as fast as concurrency allows)
    timeout: float = 900.0
    seed: int | None = None
    plugins: list[str] = field(default_factory=list)  # more worker plugins (MODULE:NAME)


@dataclass
class Fleet:
    """The worker processes; kills a random live one every few seconds and restarts it."""

    address: str
    task_queue: str
    cfg: SoakConfig
    attempts_file: Path
    on_start: Callable[[int], None] = lambda pid: None
    slots: list[WorkerProcess | None] = field(default_factory=list)
    gone: list[WorkerProcess] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    restarts: set[asyncio.Task[None]] = field(default_factory=set)
    up_since: dict[int, float] = field(default_factory=dict)

    def _spawn(self, i: int) -> WorkerProcess:
        env = {wf.ATTEMPTS_ENV: str(self.attempts_file), wf.PAUSE_ENV: str(self.cfg.pause_ms)}
        if self.cfg.heartbeat:
            env[wf.HEARTBEAT_ENV] = str(self.cfg.heartbeat)
        module = "bench._soak_workflows"
        wp = WorkerProcess(
            self.address,
            self.task_queue,
            tools=[module],
            workflows=[module],
            plugins=[f"{module}:plugins", *self.cfg.plugins],
            cwd=ROOT,
            env=env,
            sticky_timeout=self.cfg.sticky_timeout,
            name=f"soak-w{i}",
        )
        self.on_start(wp.proc.pid)
        return wp

    async def start(self, i: int, tries: int = 5) -> None:
        """Start worker ``i``; it takes its slot once it polls (a failed start is retried)."""
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
        self.slots = [None] * self.cfg.workers
        await asyncio.gather(*(self.start(i) for i in range(self.cfg.workers)))

    def kill_one(self, rng: random.Random) -> Kill | None:
        live = [i for i, wp in enumerate(self.slots) if wp is not None]
        if not live:
            return None
        # one that has polled for a while if there is one (one killed as it comes up runs nothing)
        older = [i for i in live if time.monotonic() - self.up_since[i] >= MIN_UPTIME_S]
        i = rng.choice(older or live)
        wp = self.slots[i]
        assert wp is not None
        self.slots[i] = None
        kill = Kill(time.time(), wp.proc.pid, i)
        wp.kill()
        self.gone.append(wp)
        self.kills.append(kill)
        task = asyncio.ensure_future(self.start(i))
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)
        return kill

    async def kill_loop(self, stop: asyncio.Event, rng: random.Random) -> None:
        lo, hi = self.cfg.kill_every
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.uniform(lo, hi))
                return
            self.kill_one(rng)

    async def settle(self) -> None:
        """Wait for the restarts in progress (every slot is live afterwards)."""
        while self.restarts:
            await asyncio.gather(*list(self.restarts))

    def stop(self) -> None:
        for wp in [*self.slots, *self.gone]:
            if wp is not None:
                wp.stop()


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
            except RPCError:
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
        except RPCError:  # not sent: the next poll lists it again
            self.sent.discard((req.workflow_id, req.step))


# -- driving the runs ----------------------------------------------------------------------------
async def drive_runs(
    client: Client, tq: str, bank_url: str, tag: str, cfg: SoakConfig
) -> dict[int, Any]:
    """Start ``cfg.runs`` agents (at most ``cfg.concurrency`` at once, one every
    ``cfg.start_every`` s at most); their results by index (an exception for a run that
    failed, nothing for one unfinished at the deadline)."""
    results: dict[int, Any] = {}
    slots = asyncio.Semaphore(cfg.concurrency)

    async def one(i: int) -> None:
        try:
            job = {"bank": bank_url, "account": f"{tag}-{i}", "order": ORDERS[i % len(ORDERS)]}
            handle = await client.start_workflow(
                wf.AGENT,
                job,
                id=f"{tag}-{i}",
                task_queue=tq,
                result_type=list,
                task_timeout=timedelta(seconds=cfg.task_timeout) if cfg.task_timeout else None,
            )
            results[i] = await handle.result()
        except Exception as exc:  # counted as lost, with the error in the report
            results[i] = exc
        finally:
            slots.release()

    async def release_all() -> None:
        tasks = []
        t0 = time.monotonic()
        for i in range(cfg.runs):
            await asyncio.sleep(max(0.0, t0 + i * cfg.start_every - time.monotonic()))
            await slots.acquire()
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(release_all(), cfg.timeout)
    return results


async def listed_parked(
    client: Client, want: set[tuple[str, str]], wait: float = 60.0
) -> dict[tuple[str, str], str]:
    """The parked calls ``exactcall unresolved`` lists (with their reason), once all of
    ``want`` are listed or ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        rows = {
            (r.workflow_id, r.step): r.reason for r in await reconciliation.list_unresolved(client)
        }
        if want <= {k for k, why in rows.items() if why} or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


# -- the soak ------------------------------------------------------------------------------------
async def run_soak(
    client: Client,
    address: str,
    bank: Bank,
    cfg: SoakConfig,
    on_start: Callable[[int], None] = lambda pid: None,
    say: Callable[[str], None] = lambda msg: None,
) -> dict[str, Any]:
    """Run the soak against ``address`` (``client`` is connected to it with exactcall's
    plugin); return the figures. Every worker process it started is gone when it returns."""
    rng = random.Random(cfg.seed)
    tag = f"soak-{uuid.uuid4().hex[:8]}"
    tq = f"{tag}-tq"
    with tempfile.TemporaryDirectory(prefix="exactcall-soak-") as tmp:
        attempts_file = Path(tmp) / "attempts.jsonl"
        attempts_file.touch()
        fleet = Fleet(address, tq, cfg, attempts_file, on_start)
        bot = ApprovalBot(client, tag)
        stop = asyncio.Event()
        try:
            await fleet.start_all()
            say(f"{cfg.workers} workers up on {tq}; {cfg.runs} runs, {cfg.concurrency} at once")
            t0 = time.monotonic()
            tasks = [
                asyncio.ensure_future(bot.run(stop)),
                asyncio.ensure_future(fleet.kill_loop(stop, rng)),
            ]
            results = await drive_runs(client, tq, bank.url, tag, cfg)
            wall = time.monotonic() - t0
            stop.set()
            await asyncio.gather(*tasks)
            await fleet.settle()  # every worker up again: the parked calls can publish
            want = {
                (f"{tag}-{i}", row["step"])
                for i, out in results.items()
                if isinstance(out, list)
                for row in out
                if row["outcome"] == "unknown"
            }
            parked = await listed_parked(client, want)
            payments = [p for p in bank.payments() if p["to_account"].startswith(f"{tag}-")]
            done = [f"{tag}-{i}" for i, out in results.items() if isinstance(out, list)]
            report = tally(
                tag,
                cfg.runs,
                ORDERS,
                results,
                payments,
                parked,
                read_attempts(attempts_file),
                await read_agents(client, done),
                fleet.kills,
                bound=(cfg.heartbeat or DEFAULT_HEARTBEAT_S) + 2,
            )
            report["runs"] = cfg.runs
        finally:
            stop.set()
            fleet.stop()
    report.update(
        wall_s=round(wall, 1),
        approvals=bot.approved,
        approvals_refused=bot.refused,
        config={**asdict(cfg), "task_queue": tq},
        kill_log=[asdict(k) for k in fleet.kills],
    )
    return report


# -- command line ---------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    d = SoakConfig()
    ap.add_argument("--runs", type=int, default=d.runs)
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--concurrency", type=int, default=d.concurrency, help="runs in flight at once")
    ap.add_argument(
        "--sticky-timeout",
        type=float,
        default=d.sticky_timeout,
        help="the workers' sticky queue schedule-to-start timeout (Temporal's default: 10 s)",
    )
    ap.add_argument(
        "--heartbeat",
        type=float,
        default=None,
        help=f"the tools' heartbeat timeout (exactcall's default: {DEFAULT_HEARTBEAT_S:g} s)",
    )
    ap.add_argument(
        "--task-timeout",
        type=float,
        default=None,
        help="the agents' workflow task timeout (start_workflow; Temporal's default: 10 s)",
    )
    ap.add_argument(
        "--tuned",
        action="store_true",
        help="--sticky-timeout 1 --heartbeat 2 --task-timeout 2 (what a user would tune)",
    )
    ap.add_argument(
        "--pause-ms",
        type=int,
        default=d.pause_ms,
        help="tool bodies sleep up to this before and after paying",
    )
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="another plugin for the workers (exactcall worker --plugin), e.g. an experiment",
    )
    ap.add_argument(
        "--timeout", type=float, default=d.timeout, help="runs unfinished by then are lost"
    )
    ap.add_argument("--address", help="an existing server instead of the embedded one")
    ap.add_argument(
        "--default-server", action="store_true", help="embedded server without FAST_CONFIG"
    )
    ap.add_argument("--json", type=Path, help="where to write the figures")
    return ap.parse_args(argv)


def config_of(ns: argparse.Namespace) -> SoakConfig:
    cfg = SoakConfig(
        runs=ns.runs,
        workers=ns.workers,
        concurrency=ns.concurrency,
        sticky_timeout=ns.sticky_timeout,
        heartbeat=ns.heartbeat,
        task_timeout=ns.task_timeout,
        pause_ms=ns.pause_ms,
        seed=ns.seed,
        timeout=ns.timeout,
        plugins=ns.plugin,
    )
    if ns.tuned:
        cfg.sticky_timeout = 1.0
        cfg.heartbeat = cfg.heartbeat or 2.0
        cfg.task_timeout = cfg.task_timeout or 2.0
    return cfg


async def amain(ns: argparse.Namespace) -> int:
    from bench._guard import watch
    from exactcall._server import DevServer
    from exactcall._worker import Connection, connect

    cfg = config_of(ns)
    server = None
    if ns.address is None:
        server = DevServer(fast=not ns.default_server).start()
        watch(server._proc.pid if server._proc else None)
    address = ns.address or server.address  # type: ignore[union-attr]
    load0 = os.getloadavg()
    print(
        f"soak on {address} ({'embedded, fast' if server and server.fast else 'server'}); "
        f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}",
        flush=True,
    )
    try:
        client = await connect(Connection(address=address, namespace="default"))
        with (
            tempfile.TemporaryDirectory(prefix="exactcall-soak-bank-") as tmp,
            Bank(Path(tmp) / "bank.db") as bank,
        ):
            report = await run_soak(
                client,
                address,
                bank,
                cfg,
                on_start=lambda pid: watch(pid, b"exactcall"),
                say=lambda m: print(m, flush=True),
            )
    finally:
        if server is not None:
            server.stop()
    report["loadavg"] = {"before": load0, "after": os.getloadavg()}
    report["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    print_report(report)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=1))
        print(f"figures: {ns.json}")
    return 1 if report["duplicates"] or report["lost"] else 0


def main(argv: Sequence[str] | None = None) -> None:
    code = 1
    try:
        code = asyncio.run(amain(parse(argv)))
    except SystemExit as exc:  # --help, or a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        code = 130
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # temporalio sdk-python #300: a crash at interpreter exit


if __name__ == "__main__":
    main()
