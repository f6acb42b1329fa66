"""Fleet soak: agent runs on worker processes that are SIGKILLed at random, all the time,
and with ``--faults``, frozen, cut off, their server killed, their provider's answers lost.

    python bench/soak.py                       # 300 runs, 3 workers, Temporal's defaults
    python bench/soak.py --tuned               # sticky 1 s, heartbeat 2 s, task timeout 2 s
    python bench/soak.py --runs 30 --json /tmp/soak.json
    python bench/soak.py --faults all --tuned  # worker,freeze,partition,server,provider
    python bench/soak.py --faults all --tuned --seed 1234   # the same draws again

Three ``exactcall worker`` processes serve one task queue on one dev server. Each run is a
``SoakAgent`` (``bench/_soak_workflows.py``) making four calls: a plain tool, a
provider-idempotent one, one that needs approval (given by a bot through
``exactcall.approvals`` with the exact hash) and one with a probe. Every 2-5 s a fault of the
kinds in ``--faults`` strikes (default ``worker``: a random live worker gets SIGKILL and is
restarted; the others in ``bench/_soak_faults.py``), until every run has finished. Effects
are counted at the demo bank (a real local HTTP service): each run pays its own account,
each call a distinct amount, so a duplicate is a second payment for one (account, amount).

Printed and written as JSON (``--json``): the seed, runs, calls, kills, duplicates, lost (a
call that neither finished nor ended parked with its reason, listed by ``exactcall
unresolved``), unknown (parked; each listed with its reason), and settle p50/p95: the seconds
from the SIGKILL of a worker that was running an attempt of a call to that call settled
(done, or unknown and routed to its reconciliation), read from the agent's history; also the
seconds to the agent getting the outcome; and per kind of fault: injected, calls hit,
duplicates, lost, unknown, settle p50/p95. Exit 1 on a duplicate or a lost call. Nothing is
asserted on time. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/soak.py` puts only bench/ there
    sys.path.insert(0, str(ROOT))

from temporalio.client import Client, WorkflowHandle  # noqa: E402
from temporalio.exceptions import WorkflowAlreadyStartedError  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from bench import _soak_workflows as wf  # noqa: E402
from bench._fleet import ApprovalBot, Fleet  # noqa: E402
from bench._soak_count import print_report, read_agents, read_attempts, tally  # noqa: E402
from bench._soak_faults import KINDS, Injector, Routes, TimedChaos, parse_faults  # noqa: E402
from exactcall import reconciliation  # noqa: E402
from exactcall._tool import ToolOptions  # noqa: E402
from exactcall.demo.bank import Bank  # noqa: E402
from exactcall.testing import DevServer  # noqa: E402

TEMPORAL_STICKY_DEFAULT_S = 10.0  # Worker(sticky_queue_schedule_to_start_timeout=) default
DEFAULT_HEARTBEAT_S = ToolOptions.__dataclass_fields__["heartbeat_timeout"].default.total_seconds()
ORDERS = [list(wf.TOOLS[i:] + wf.TOOLS[:i]) for i in range(len(wf.TOOLS))]


@dataclass
class SoakConfig:
    runs: int = 300
    workers: int = 3
    concurrency: int = 30
    kill_every: tuple[float, float] = (2.0, 5.0)  # seconds between two faults
    sticky_timeout: float = TEMPORAL_STICKY_DEFAULT_S
    heartbeat: float | None = None  # None: exactcall's default for the tools
    task_timeout: float | None = None  # the agents' workflow task timeout (None: Temporal's)
    pause_ms: int = 200
    start_every: float = 0.0  # seconds between run starts (0: as fast as concurrency allows)
    timeout: float = 900.0
    seed: int | None = None  # None: one is drawn, and printed
    plugins: list[str] = field(default_factory=list)  # more worker plugins (MODULE:NAME)
    faults: tuple[str, ...] = ("worker",)
    provider_share: float = 0.1  # of the calls, with --faults provider
    max_faults: int | None = None  # then no more faults (the provider's are drawn per call)


# -- driving the runs ----------------------------------------------------------------------------
async def outcome_of(
    client: Client, job: dict[str, Any], wid: str, tq: str, cfg: SoakConfig
) -> Any:
    """Start one agent and wait for its result, through server outages (a start whose answer
    was lost finds the run started; a result long-poll cut by a server kill is asked again)."""
    deadline = time.monotonic() + cfg.timeout
    handle: WorkflowHandle[Any, Any] | None = None
    while True:
        try:
            if handle is None:
                handle = await client.start_workflow(
                    wf.AGENT,
                    job,
                    id=wid,
                    task_queue=tq,
                    result_type=list,
                    task_timeout=timedelta(seconds=cfg.task_timeout) if cfg.task_timeout else None,
                )
            return await handle.result()
        except WorkflowAlreadyStartedError:
            handle = client.get_workflow_handle(wid, result_type=list)
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def drive_runs(
    client: Client, tq: str, bank_url: str, tag: str, cfg: SoakConfig, routes: Routes | None = None
) -> dict[int, Any]:
    """Start ``cfg.runs`` agents (at most ``cfg.concurrency`` at once, one every
    ``cfg.start_every`` s at most); their results by index (an exception for a run that
    failed, nothing for one unfinished at the deadline). ``routes``: which calls pay through
    a chaos proxy."""
    results: dict[int, Any] = {}
    slots = asyncio.Semaphore(cfg.concurrency)

    async def one(i: int) -> None:
        try:
            job: dict[str, Any] = {
                "bank": bank_url,
                "account": f"{tag}-{i}",
                "order": ORDERS[i % len(ORDERS)],
            }
            if routes is not None:
                job["banks"] = routes.job(i, bank_url, len(wf.TOOLS))
            results[i] = await outcome_of(client, job, f"{tag}-{i}", tq, cfg)
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
    server: DevServer | None = None,
    on_server_start: Callable[[int | None], None] = lambda pid: None,
) -> dict[str, Any]:
    """Run the soak against ``address`` (``client`` is connected to it with exactcall's
    plugin); return the figures. ``server``: the dev server behind ``address``, on a database
    file, for ``cfg.faults`` with ``server`` (killed and restarted). Every worker process and
    proxy it started is gone when it returns."""
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    heartbeat = cfg.heartbeat or DEFAULT_HEARTBEAT_S
    tag = f"soak-{uuid.uuid4().hex[:8]}"
    tq = f"{tag}-tq"
    chaos = []
    if "provider" in cfg.faults:
        chaos = [TimedChaos(bank.url, f) for f in ("drop-response", "error-after-commit")]
    with tempfile.TemporaryDirectory(prefix="exactcall-soak-") as tmp, contextlib.ExitStack() as up:
        for proxy in chaos:
            up.enter_context(proxy)
        routes = Routes(chaos, cfg.provider_share, seed) if chaos else None
        attempts_file = Path(tmp) / "attempts.jsonl"
        attempts_file.touch()
        env = {wf.ATTEMPTS_ENV: str(attempts_file), wf.PAUSE_ENV: str(cfg.pause_ms)}
        if cfg.heartbeat:
            env[wf.HEARTBEAT_ENV] = str(cfg.heartbeat)
        fleet = Fleet(
            address,
            tq,
            cfg.workers,
            env,
            cfg.sticky_timeout,
            cfg.plugins,
            partitions="partition" in cfg.faults,
            on_start=on_start,
        )
        injector = Injector(fleet, server, cfg.faults, cfg.kill_every, heartbeat, rng)
        injector.on_server_start = on_server_start
        if cfg.max_faults is not None:
            injector.limit = cfg.max_faults
        bot = ApprovalBot(client, tag)
        stop = asyncio.Event()
        try:
            await fleet.start_all()
            say(
                f"{cfg.workers} workers up on {tq}; {cfg.runs} runs, {cfg.concurrency} at once; "
                f"faults {','.join(cfg.faults)}; seed {seed}"
            )
            t0 = time.monotonic()
            tasks = [
                asyncio.ensure_future(bot.run(stop)),
                asyncio.ensure_future(injector.loop(stop)),
            ]
            results = await drive_runs(client, tq, bank.url, tag, cfg, routes)
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
            faults = sorted(
                [*fleet.faults, *injector.faults, *(routes.faults() if routes else [])],
                key=lambda f: f.t,
            )
            report = tally(
                tag,
                cfg.runs,
                ORDERS,
                results,
                payments,
                parked,
                read_attempts(attempts_file),
                await read_agents(client, done),
                faults,
                bound=heartbeat + 2,
            )
            report["runs"] = cfg.runs
        finally:
            stop.set()
            fleet.stop()
    report.update(
        seed=seed,
        wall_s=round(wall, 1),
        approvals=bot.approved,
        approvals_refused=bot.refused,
        fail_stops=fleet.fail_stops,
        config={**asdict(cfg), "task_queue": tq},
        fault_log=[asdict(f) for f in faults],
    )
    return report


# -- command line ---------------------------------------------------------------------------------
def _faults(text: str) -> tuple[str, ...]:
    try:
        return parse_faults(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--faults: ")) from None


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
    ap.add_argument(
        "--seed", type=int, default=None, help="the draws' seed (printed: re-run a soak with it)"
    )
    ap.add_argument(
        "--faults",
        type=_faults,
        default=("worker",),
        help=f"kinds of fault to inject, comma-separated: {','.join(KINDS)}, or all (worker)",
    )
    ap.add_argument(
        "--max-faults", type=int, default=None, help="no more faults after this many (none)"
    )
    ap.add_argument(
        "--provider-share",
        type=float,
        default=d.provider_share,
        help="with the provider fault: the share of calls whose payment's answer is lost",
    )
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
        faults=ns.faults,
        provider_share=ns.provider_share,
        max_faults=ns.max_faults,
    )
    if ns.tuned:
        cfg.sticky_timeout = 1.0
        cfg.heartbeat = cfg.heartbeat or 2.0
        cfg.task_timeout = cfg.task_timeout or 2.0
    return cfg


async def amain(ns: argparse.Namespace) -> int:
    from bench._guard import watch
    from exactcall._worker import Connection, connect

    cfg = config_of(ns)
    if "server" in cfg.faults and ns.address:
        print(
            "soak.py: the server fault kills and restarts the soak's own dev server on its "
            "database file: leave out --address, or the server fault",
            file=sys.stderr,
        )
        return 2
    server = None
    db = None
    if ns.address is None:
        # on a database file when it is to be killed and restarted on it (kept on a failure)
        if "server" in cfg.faults:
            db = Path(tempfile.mkdtemp(prefix="exactcall-soak-server-")) / "temporal.db"
        server = DevServer(fast=not ns.default_server, db=db).start()
        watch(server.pid)
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
                server=server,
                on_server_start=lambda pid: watch(pid),
            )
    finally:
        if server is not None:
            server.stop()
    failed = report["duplicates"] or report["lost"]
    if db is not None and failed:
        print(f"the server's database, to read the runs: exactcall server --db {db}")
    elif db is not None:
        shutil.rmtree(db.parent, ignore_errors=True)
    report["loadavg"] = {"before": load0, "after": os.getloadavg()}
    report["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    print_report(report)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=1))
        print(f"figures: {ns.json}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    from bench._guard import run_main

    run_main(lambda: amain(parse(argv)))


if __name__ == "__main__":
    main()
