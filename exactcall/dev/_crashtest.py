"""``exactcall crashtest``: kill the worker at every boundary of a workflow, count real executions.

For each call the workflow makes (found by a clean run first), and each boundary — before the
call, right after its effect, after its recorded result, while it waits for an approval, during
its reconciliation — the workflow runs anew on a worker process that SIGKILLs itself at that
point; a fresh worker finishes the run. Every entry into a tool's body is appended to a file
(``EXACTCALL_EXECUTIONS_FILE``) before the body runs, so the count survives the kill. Pending
approvals are approved with their exact hash; parked calls are abandoned (and reported).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from exactcall import approvals, reconciliation
from exactcall._crash import EXECUTIONS_ENV
from exactcall._tool import Tool
from exactcall.dev._procs import WorkerProcess

__all__ = ["Boundary", "Outcome", "boundaries_for", "run_crashtest"]


@dataclass(frozen=True)
class Boundary:
    name: str
    step: str | None
    chain: tuple[str | None, ...]
    """Crash specs of the successive workers (None: a healthy worker)."""
    kill_on_pending: bool = False


@dataclass
class Outcome:
    boundary: str
    executions: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unapproved: list[str] = field(default_factory=list)
    final: str = ""
    seconds: float = 0.0

    @property
    def bad(self) -> bool:
        return bool(self.duplicates or self.unapproved)


@dataclass
class Target:
    """What to run: a workflow by name, its input, and the modules of its tools/workflows."""

    workflow: str
    args: list[Any]
    tools: Sequence[str]
    workflows: Sequence[str]
    tool_defs: dict[str, Tool]
    plugins: Sequence[str] = ()
    """``MODULE:NAME`` Temporal plugins, for every worker (an agent framework's)."""
    timeout: float = 240.0


def boundaries_for(calls: list[tuple[str, str]], tools: dict[str, Tool]) -> list[Boundary]:
    out = [Boundary("no crash", None, (None,))]
    for tool, step in calls:
        at = f"{tool}@{step}"
        out += [
            Boundary(f"before {step}", step, (f"{at}:before_claim:1", None)),
            Boundary(f"after the effect of {step}", step, (f"{at}:after_call:1", None)),
            Boundary(f"after the result of {step}", step, (f"{at}:after_record:1", None)),
        ]
        t = tools.get(tool)
        if t is not None and t.options.approval:
            out.append(Boundary(f"waiting for approval of {step}", step, (None, None), True))
        if t is not None and t.options.reconcile is not None:
            out.append(
                Boundary(
                    f"during reconciliation of {step}",
                    step,
                    (f"{at}:after_call:1", f"{at}:in_probe", None),
                )
            )
    return out


class _Run:
    """One run of the target under one boundary."""

    def __init__(self, client: Client, address: str, target: Target, b: Boundary) -> None:
        self.client, self.address, self.target, self.b = client, address, target, b
        self.tq = f"crashtest-{uuid.uuid4().hex[:10]}"
        self.wid = f"crashtest-{uuid.uuid4().hex[:10]}"
        self.dir = Path(tempfile.mkdtemp(prefix="exactcall-crashtest-"))
        self.executions = self.dir / "executions.jsonl"
        self.workers: list[WorkerProcess] = []
        self.stage = 0
        self.killed_on_pending = False
        self.unknown: set[str] = set()

    async def _worker(self) -> WorkerProcess:
        spec = self.b.chain[min(self.stage, len(self.b.chain) - 1)]
        wp = WorkerProcess(
            self.address,
            self.tq,
            tools=self.target.tools,
            workflows=self.target.workflows,
            crash_at=spec,
            env={EXECUTIONS_ENV: str(self.executions)},
            args=[a for p in self.target.plugins for a in ("--plugin", p)],
        )
        self.workers.append(wp)
        return await wp.started()

    async def run(self) -> Outcome:
        timeout = self.target.timeout
        began = time.monotonic()
        out = Outcome(self.b.name)
        try:
            await self._worker()
            handle = await self.client.start_workflow(
                self.target.workflow, args=self.target.args, id=self.wid, task_queue=self.tq
            )
            result = asyncio.ensure_future(handle.result())
            deadline = time.monotonic() + timeout
            while not result.done() and time.monotonic() < deadline:
                await self._tend()
                await asyncio.wait({result}, timeout=0.3)
            out.final = _final(result, self.unknown)
            await self._judge(out)
        finally:
            for wp in self.workers:
                wp.stop()
            with contextlib.suppress(OSError):
                for p in self.dir.iterdir():
                    p.unlink()
                self.dir.rmdir()
        out.seconds = round(time.monotonic() - began, 1)
        return out

    async def _tend(self) -> None:
        """Replace a dead worker; approve pending calls; abandon parked ones."""
        if self.workers[-1].proc.poll() is not None:  # killed at its crash point
            self.stage += 1
            await self._worker()
        with contextlib.suppress(Exception):
            view = await asyncio.wait_for(approvals.view(self.client, self.wid), 2)
            for req in view.pending:
                if self.b.kill_on_pending and not self.killed_on_pending:
                    self.killed_on_pending = True
                    self.workers[-1].kill()
                    self.stage += 1
                    await self._worker()
                await approvals.approve(
                    self.client, self.wid, req.step, args_hash=req.args_hash, by="crashtest"
                )
        with contextlib.suppress(Exception):
            for row in await reconciliation.list_unresolved(self.client):
                if row.workflow_id == self.wid and row.step not in self.unknown:
                    self.unknown.add(row.step)
                    await reconciliation.resolve(
                        self.client,
                        self.wid,
                        row.step,
                        "abandon",
                        by="crashtest",
                        reason="crashtest: unresolved calls are abandoned to finish the run",
                    )

    async def _judge(self, out: Outcome) -> None:
        lines = []
        if self.executions.exists():
            lines = [json.loads(x) for x in self.executions.read_text().splitlines() if x]
        for line in lines:
            out.executions[line["step"]] = out.executions.get(line["step"], 0) + 1
            if (line["tool"], line["step"]) not in out.calls:
                out.calls.append((line["tool"], line["step"]))
        for step, n in out.executions.items():
            tool = next(x["tool"] for x in lines if x["step"] == step)
            t = self.target.tool_defs.get(tool)
            if n > 1 and t is not None and t.options.provider_idempotent:
                out.protected.append(f"{step} re-sent x{n - 1} with the same key")
            elif n > 1:
                out.duplicates.append(f"{step} ran {n} times")
        out.unknown = sorted(self.unknown)
        await self._check_approvals(out, lines)

    async def _check_approvals(self, out: Outcome, lines: list[dict[str, Any]]) -> None:
        """A call needing approval ran only under an approval of exactly its args hash.

        Read from the agent's history (the intents it scheduled), so no worker is needed.
        """
        needing = {
            x["step"]
            for x in lines
            if (t := self.target.tool_defs.get(x["tool"])) is not None and t.options.approval
        }
        if not needing:
            return
        from exactcall.evidence._replay import recorded_intents

        history = await self.client.get_workflow_handle(self.wid).fetch_history()
        intents = await recorded_intents(history, self.client.data_converter)
        approved = {
            i.step
            for i in intents
            if i.approval is not None and i.approval.args_hash == i.args_hash
        }
        out.unapproved = [f"{s} ran without an approval of its args" for s in needing - approved]


def _final(result: asyncio.Future[Any], abandoned: Collection[str] = ()) -> str:
    if not result.done():
        result.cancel()
        return "did not finish"
    exc = result.exception()
    if exc is not None:
        if abandoned and _abandoned(exc):
            # the crashtest abandoned the parked call itself, to let the run end
            return f"ended by the crashtest's abandon of unresolved {', '.join(sorted(abandoned))}"
        return f"failed: {type(exc).__name__}"
    value = result.result()
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return ", ".join(f"{v.get('tool', '?')}={v.get('status', '?')}" for v in value)
    return "completed"


def _abandoned(exc: BaseException | None) -> bool:
    """Whether a workflow failure is (caused by) a CallAbandoned."""
    while exc is not None:
        if type(exc).__name__ == "CallAbandoned" or getattr(exc, "type", None) == "CallAbandoned":
            return True
        exc = exc.__cause__ or getattr(exc, "cause", None)
    return False


async def run_crashtest(
    client: Client,
    address: str,
    target: Target,
    *,
    concurrency: int = 3,
    progress: Any = print,
) -> tuple[list[Outcome], list[tuple[str, str]]]:
    """The clean run first (to find the calls), then every boundary. A clean run that did not
    finish, or made no exactcall call, proves nothing: no boundary is run (see not_proven)."""
    clean = await _Run(client, address, target, Boundary("no crash", None, (None,))).run()
    calls = clean.calls
    progress(f"found {len(calls)} calls: {', '.join(s for _, s in calls)}")
    if not_proven(clean):
        return [clean], calls
    bounds = boundaries_for(calls, target.tool_defs)[1:]
    sem = asyncio.Semaphore(concurrency)
    results: list[Outcome] = [clean]

    async def one(b: Boundary) -> Outcome:
        async with sem:
            o = await _Run(client, address, target, b).run()
            mark = "DUPLICATE" if o.bad else "ok"
            progress(f"  [{len(results)}/{len(bounds) + 1}] {b.name}: {mark} ({o.seconds} s)")
            results.append(o)
            return o

    ordered = await asyncio.gather(*(one(b) for b in bounds))
    return [clean, *ordered], calls


def not_proven(clean: Outcome) -> str | None:
    """Why the clean run proves nothing (None: it does)."""
    if clean.final == "did not finish":
        return (
            f"the run without a crash did not finish within {clean.seconds:g} s, so no "
            "boundary was tried. Does the workflow need input (--input), a plugin (--plugin, "
            "for an agent framework's workflow), a signal, or more time (--timeout)?"
        )
    if clean.final.startswith("failed"):
        return f"the run without a crash {clean.final}, so no boundary was tried"
    if not clean.calls:
        return (
            "the run without a crash made no exactcall call, so there was nothing to crash. "
            "Are its tools exactcall tools (--tools MODULE), and does its input make it call them?"
        )
    return None


def report_table(outcomes: list[Outcome], steps: list[str]) -> str:
    head = f"{'BOUNDARY':<38} {'EXECUTIONS ' + ' '.join(steps):<44} {'UNKNOWN':<16} VERDICT"
    rows = [head]
    for o in outcomes:
        counts = " ".join(str(o.executions.get(s, 0)).rjust(len(s)) for s in steps)
        verdict = "DUPLICATE: " + "; ".join(o.duplicates + o.unapproved) if o.bad else "ok"
        if o.protected and not o.bad:
            verdict = "ok (" + "; ".join(o.protected) + ")"
        unknown = ",".join(o.unknown) or "-"
        rows.append(f"{o.boundary:<38} {'           ' + counts:<44} {unknown:<16} {verdict}")
        rows.append(f"{'':<38} final: {o.final}")
    return "\n".join(rows)


def as_json(
    outcomes: list[Outcome],
    calls: list[tuple[str, str]],
    plain: dict[str, Any] | None,
    why_not: str | None = None,
) -> str:
    return json.dumps(
        {
            "proven": why_not is None,
            "not_proven": why_not,
            "calls": [{"tool": t, "step": s} for t, s in calls],
            "boundaries": [asdict(o) | {"bad": o.bad} for o in outcomes],
            "plain_temporal": plain,
            "duplicates": sum(len(o.duplicates) for o in outcomes),
            "unapproved": sum(len(o.unapproved) for o in outcomes),
        },
        indent=2,
    )


async def plain_temporal(client: Client, address: str, bank_url: str) -> dict[str, Any]:
    """The same payment as a plain Temporal activity, worker killed right after it."""
    from exactcall.demo.bank import Bank as _Bank  # noqa: F401  (the caller runs the bank)

    tq = f"crashtest-plain-{uuid.uuid4().hex[:8]}"
    who = f"plain-{uuid.uuid4().hex[:6]}"
    a = WorkerProcess(
        address,
        tq,
        tools=["exactcall.demo.tools"],
        workflows=["exactcall.demo.workflows"],
        env={"EXACTCALL_DEMO_CRASH_BARE": "1"},
    )
    workers = [a]
    try:
        await a.started()
        handle = await client.start_workflow(
            "BarePaymentAgent", args=[bank_url, 10, who], id=tq, task_queue=tq
        )
        await a.killed()
        b = WorkerProcess(
            address,
            tq,
            tools=["exactcall.demo.tools"],
            workflows=["exactcall.demo.workflows"],
            env={},
        )
        workers.append(b)
        await b.started()
        await asyncio.wait_for(handle.result(), 120)
    finally:
        for w in workers:
            w.stop()
    n = _bank_count(bank_url, who)
    return {"boundary": "after the effect of bare_pay", "executions": n, "duplicate": n > 1}


def _bank_count(bank_url: str, who: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{bank_url}/payments/count?to={who}", timeout=10) as r:
        return int(json.loads(r.read())["count"])


async def main(ns: Any) -> int:
    """``exactcall crashtest`` (argparse namespace from the CLI)."""
    from exactcall._worker import Connection, connect, load_plugins, load_tools
    from exactcall.demo.bank import Bank
    from exactcall.embedded._server import DevServer

    sys.path.insert(0, str(Path.cwd()))
    if not ns.demo and not ns.target:
        print("exactcall crashtest: give MODULE:WORKFLOW (with --tools) or --demo", file=sys.stderr)
        return 2
    say = (lambda *a, **k: print(*a, **k, file=sys.stderr, flush=True)) if ns.json else print
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if ns.address:
            address = ns.address
        else:
            address = stack.enter_context(DevServer(fast=True)).address
            say(f"embedded Temporal server on {address}")
        bank = stack.enter_context(Bank(tmp / "bank.db"))
        others = load_plugins(ns.plugin)
        client = await connect(Connection(address=address, namespace=ns.namespace), None, others)
        target = _target(ns, bank.url, load_tools)
        outcomes, calls = await run_crashtest(
            client, address, target, concurrency=ns.concurrency, progress=say
        )
        why_not = not_proven(outcomes[0])
        plain = None
        if why_not is None:
            say("plain Temporal activity for comparison ...")
            plain = await plain_temporal(client, address, bank.url)
    if why_not is not None:
        if ns.json:
            print(as_json(outcomes, calls, plain, why_not))
        else:
            print()
            print(report_table(outcomes, [s for _, s in calls]))
        print(f"\nexactcall crashtest: NOT PROVEN: {why_not}", file=sys.stderr)
        return 1
    assert plain is not None
    bad = any(o.bad for o in outcomes)
    if ns.json:
        print(as_json(outcomes, calls, plain))
    else:
        print()
        print(report_table(outcomes, [s for _, s in calls]))
        print()
        print(
            f"plain Temporal activity, worker killed after the effect: {plain['executions']} "
            f"executions"
            + (" (DUPLICATE: this is what exactcall prevents)" if plain["duplicate"] else "")
        )
        dups = sum(len(o.duplicates) + len(o.unapproved) for o in outcomes)
        print(
            f"\nexactcall: {len(outcomes)} runs, "
            + (f"{dups} problem(s)" if bad else "no call ran twice or without its approval")
        )
    return 1 if bad else 0


def _target(ns: Any, bank_url: str, load_tools: Any) -> Target:
    if ns.demo:
        modules = ["exactcall.demo.tools"]
        defs = {t.name: t for t in load_tools(modules)}
        return Target(
            "SupportAgent",
            [bank_url],
            modules,
            ["exactcall.demo.agent", "exactcall.demo.workflows"],
            defs,
            ns.plugin,
            ns.timeout,
        )
    module, _, cls = ns.target.partition(":")
    tools = [t.strip() for item in ns.tools for t in item.split(",") if t.strip()]
    defs = {t.name: t for t in load_tools(tools)}
    args: list[Any] = []
    if ns.input is not None:
        value = json.loads(ns.input)
        args = value if isinstance(value, list) else [value]
    return Target(cls or module, args, tools, [module, *ns.workflows], defs, ns.plugin, ns.timeout)
