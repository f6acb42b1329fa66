"""Fault-schedule explorer: per seed, a random schedule of operations on a few workflows, then
checks after each; prints the smallest failing schedule it finds.

    python bench/explore.py                       # schedules for 10 minutes
    python bench/explore.py --schedules 20 --json /tmp/explore.json
    python bench/explore.py --seed 1234           # that seed's schedule again

Two ``exactcall worker`` processes (each behind a fault proxy) serve the ``ExploreAgent``s of
``bench/_explore_workflows.py``: four calls each, a plain tool, one with a probe, a
provider-idempotent one with an undo, one that needs approval. A schedule (``draw``) starts
two workflows and then draws operations: SIGKILL of a worker, a worker armed to SIGKILL itself
at a crash point of a tool (in_call, after_call, after_record), a freeze (SIGSTOP) or a
partition of a worker for 2.5-6 s, a reset of a workflow to a random completed workflow task,
a re-run of the same workflow id, continue-as-new, terminate, approve (the exact hash), deny,
double-approve, an approval of another hash, resolving the parked calls truthfully (from the
bank), and ``exactcall undo``; each followed by a wait of 0.2-2.5 s.

After each operation: at most one payment per (workflow id, step) and per undo at the bank,
and no payment of the approval tool without an approval of exactly its hash. At the end, once
every fault is healed (and the pending approvals approved, as a person would): every
started workflow that was not terminated ends, each call with exactly one outcome (done with
its payment and not parked; unknown and parked with its reason, or resolved; denied and not
paid), none lost. A failing schedule is shrunk (operations dropped one at a time while it
still fails, for at most ``--shrink`` re-runs); the smallest one is printed. Exit 1 if any
schedule failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/explore.py` puts only bench/ there
    sys.path.insert(0, str(ROOT))

from bench import _explore_workflows as ew  # noqa: E402
from bench._explore_world import CRASH_POINTS, Run, World  # noqa: E402
from bench._guard import run_main  # noqa: E402

OPS = {  # name: weight
    "start": 2,
    "kill": 2,
    "crash": 3,
    "freeze": 2,
    "partition": 2,
    "reset": 2,
    "rollover": 1,
    "terminate": 1,
    "approve": 3,
    "deny": 1,
    "double-approve": 1,
    "approve-wrong": 1,
    "resolve": 2,
    "undo": 1,
}
WORKFLOWS = 2
WORKERS = 2


def draw(seed: int, length: tuple[int, int] = (6, 10)) -> list[dict[str, Any]]:
    """The schedule of ``seed``: the workflows' starts, then random operations."""
    rng = random.Random(seed)
    ops: list[dict[str, Any]] = []
    for i in range(WORKFLOWS):
        ops.append({"op": "start", "wf": i, "wait": round(rng.uniform(0.2, 1.5), 2)})
    names, weights = zip(*OPS.items(), strict=True)
    for _ in range(rng.randint(*length)):
        name = rng.choices(names, weights)[0]
        op: dict[str, Any] = {"op": name}
        if name in ("kill", "crash", "freeze", "partition"):
            op["worker"] = rng.randrange(WORKERS)
        else:
            op["wf"] = rng.randrange(WORKFLOWS)
        if name == "crash":
            op["tool"] = rng.choice([t for t, _ in ew.STEPS])
            op["point"] = rng.choice(CRASH_POINTS)
        if name in ("freeze", "partition"):
            op["seconds"] = round(rng.uniform(2.5, 6.0), 1)
        if name == "reset":
            op["at"] = round(rng.random(), 3)
        op["wait"] = round(rng.uniform(0.2, 2.5), 2)
        ops.append(op)
    return ops


async def run_schedule(
    world: World, seed: int, ops: Sequence[dict[str, Any]], wait: float = 90.0
) -> dict[str, Any]:
    """Run ``ops`` on fresh workflow ids; what the checks found (empty: passed)."""
    run = Run(world, f"x{seed}-{os.urandom(2).hex()}", WORKFLOWS)
    t0 = time.monotonic()
    found: list[str] = []
    for n, op in enumerate(ops):
        await run.do(op)
        found = [f"after op {n} ({op['op']}): {f}" for f in run.safety()]
        if found:
            break
    await world.heal()
    if not found:
        found = await run.liveness(wait)
        await asyncio.sleep(1.0)  # a late effect, if one is still on its way
        found += [f"at the end: {f}" for f in run.safety()]
    return {
        "seed": seed,
        "ops": list(ops),
        "found": found,
        "log": run.log,
        "seconds": round(time.monotonic() - t0, 1),
    }


async def shrink(world: World, failed: dict[str, Any], budget: int) -> dict[str, Any]:
    """Drop operations one at a time (the last first) while the schedule still fails, for
    at most ``budget`` re-runs; the smallest failing run found."""
    best = failed
    i = len(best["ops"]) - 1
    while i >= 0 and budget > 0:
        trial = best["ops"][:i] + best["ops"][i + 1 :]
        budget -= 1
        out = await run_schedule(world, failed["seed"], trial)
        if out["found"]:
            best = out
        i -= 1
    return best


async def explore(
    world: World,
    seeds: Iterable[int],
    deadline: float = float("inf"),
    shrink_budget: int = 6,
    say: Any = print,
) -> dict[str, Any]:
    """Run the schedules of ``seeds`` (until ``deadline``, a ``time.monotonic()``); the
    figures, failures and the smallest failing schedule."""
    ran: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for seed in seeds:
        if time.monotonic() > deadline:
            break
        out = await run_schedule(world, seed, draw(seed))
        ran.append(out)
        ops = " ".join(op["op"] for op in out["ops"][WORKFLOWS:])
        verdict = "FAILED" if out["found"] else "ok"
        say(f"seed {seed}: {verdict} in {out['seconds']} s: {ops}")
        for f in out["found"]:
            say(f"  {f}")
        if out["found"]:
            failures.append(out)
    smallest = None
    if failures:
        first = min(failures, key=lambda f: len(f["ops"]))
        smallest = await shrink(world, first, shrink_budget)
    kinds = Counter(op["op"] for out in ran for op in out["ops"])
    acted = Counter(
        line.split(" ", 1)[0] for out in ran for line in out["log"] if "did nothing" not in line
    )
    return {
        "schedules": len(ran),
        "failed": len(failures),
        "ops_drawn": dict(sorted(kinds.items())),
        "ops_that_acted": dict(sorted(acted.items())),
        "seconds": round(sum(out["seconds"] for out in ran), 1),
        "worker_deaths": dict(Counter(str(code) for code in world.deaths)),
        "failures": failures,
        "smallest_failing": smallest,
        "runs": [{k: out[k] for k in ("seed", "seconds", "log")} for out in ran],
    }


async def amain(ns: argparse.Namespace) -> int:
    from bench._guard import watch
    from exactcall._worker import Connection, connect
    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer

    rng = random.SystemRandom()
    count = 1 if ns.seed is not None else (ns.schedules or 10**9)
    seeds = (ns.seed if ns.seed is not None else rng.randrange(2**31) for _ in range(count))
    tmp = tempfile.mkdtemp(prefix="exactcall-explore-")  # kept on a failure: the histories
    server = DevServer(db=Path(tmp) / "temporal.db").start()
    watch(server.pid)
    world: World | None = None
    try:
        client = await connect(Connection(address=server.address, namespace="default"))
        with Bank(Path(tmp) / "bank.db") as bank:
            world = World(client, server.address, bank)
            world.on_start = lambda pid: watch(pid, b"exactcall")
            await world.start(WORKERS)
            deadline = time.monotonic() + ns.minutes * 60
            report = await explore(world, seeds, deadline, ns.shrink)
    finally:
        if world is not None:
            world.stop()
        server.stop()
    if report["failed"]:
        print(f"the server's database, to read the runs: exactcall server --db {tmp}/temporal.db")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{report['schedules']} schedules, {report['failed']} failed, {report['seconds']} s")
    print(f"operations that acted: {report['ops_that_acted']}")
    print(f"workers that died by themselves, by exit code: {report['worker_deaths']}")
    small = report["smallest_failing"]
    if small:
        print(f"smallest failing schedule (seed {small['seed']}, {len(small['ops'])} ops):")
        for op, line in zip(small["ops"], small["log"], strict=False):
            print(f"  {json.dumps(op)}  -> {line}")
        for f in small["found"]:
            print(f"  FOUND {f}")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=1))
        print(f"figures: {ns.json}")
    return 1 if report["failed"] else 0


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="stop starting schedules then")
    ap.add_argument("--schedules", type=int, default=None, help="at most this many")
    ap.add_argument("--seed", type=int, default=None, help="run that seed's schedule only")
    ap.add_argument("--shrink", type=int, default=6, help="re-runs to shrink a failure with")
    ap.add_argument("--json", type=Path, help="where to write the figures")
    run_main(lambda: amain(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
