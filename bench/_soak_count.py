"""Counting for ``bench/soak.py``: effects at the bank, lost calls, and settle times.

Effects are counted at the bank (each run pays its own account, each call a distinct amount),
never by the code under test. A call is *settled* (the issue's words: "done, or unknown and
routed") at the ``ActivityTaskCompleted`` of its tool activity in the agent's history, or, for
an unknown outcome, at the start of its reconciliation workflow (the attempt that finds the
outcome unknown starts it; the agent starts it as a child if that attempt could not). A fault
*struck* a call if an attempt of the call's tool activity was running on the process it hit
(a kill, a freeze, a partition; any process for a server kill: the attempt started before
and had not ended by then), or the bank's response to the call's payment was lost (a provider
fault), before the call settled. Each call is counted under every kind of fault that struck
it (``none`` if none did). Two times are taken from the last fault that struck it, if all
that struck it were of one kind (else the call's time is counted as ``mixed``): to the call
settled, and (for kills) to the agent getting the outcome (the ``workflow.now()`` of the
workflow task that saw it: this one also waits for the agent's own workflow task, on a sticky
queue or held by a dead worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client
from temporalio.service import RPCError

from exactcall.reconciliation._verdicts import reconcile_id

Attempts = dict[tuple[str, str], list[dict[str, Any]]]
HEADLINE = (
    "runs",
    "calls",
    "kills",
    "duplicates",
    "lost",
    "unknown",
    "waiting",
    "settle_p50_s",
    "settle_p95_s",
)


@dataclass
class Fault:
    """One fault injected: ``worker`` (SIGKILL of a worker), ``freeze`` (SIGSTOP of its process
    group), ``partition`` (its link to the frontend blackholed), ``server`` (SIGKILL of the dev
    server, restarted on its database), ``provider`` (the bank's response to one call's
    payment lost after the payment was booked: ``call`` is its (account, amount))."""

    kind: str
    t: float
    pid: int | None = None
    worker: int | None = None
    until: float | None = None
    """When a freeze, partition or server outage ended (None: a kill, or a lost response)."""
    detail: str = ""
    call: tuple[str, int] | None = None
    hit: int = 0
    """Calls this fault interrupted (filled in by :func:`tally`)."""


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    return round(s[max(0, math.ceil(p / 100 * len(s)) - 1)], 3)


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Count, p50, p95 and max of some seconds."""
    top = max(values) if values else None
    return {
        "n": len(values),
        "p50_s": pct(values, 50),
        "p95_s": pct(values, 95),
        "max_s": top if top is None else round(top, 3),
    }


def read_attempts(path: Path) -> Attempts:
    """The attempts of each call (by workflow id, step) from the workers' attempt log: pid,
    start time, kind (call or probe) and when it ended (no end: its process died)."""
    out: Attempts = defaultdict(list)
    ended: dict[str, float] = {}
    starts = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):  # a line cut by a SIGKILL mid-write
            row = json.loads(line)
            if row["ev"] == "end":
                ended[row["id"]] = row["t"]
            else:
                starts.append(row)
    for row in starts:
        end = ended.get(row["id"])
        out[(row["wf"], row["step"])].append({**row, "ended": end is not None, "end": end})
    return out


@dataclass
class AgentHistory:
    """What the soak reads from one agent's history."""

    settled: dict[str, float]
    """Step -> when its outcome was in the history (the calls are sequential)."""
    sticky_timeouts: int = 0
    """Workflow tasks that waited on the sticky queue of a dead worker, then moved."""
    task_timeouts: int = 0
    """Workflow tasks held by a worker that died (the workflow task timeout ran out)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Step -> key of the calls whose tool activity failed (unknown ones are reconciled)."""


async def read_agents(client: Client, workflow_ids: Sequence[str]) -> dict[str, AgentHistory]:
    """The agents' histories, read after the soak; an unknown call settled when its
    reconciliation started (by the attempt that found it unknown, or as the agent's child)."""
    gate = asyncio.Semaphore(16)

    async def one(wid: str) -> tuple[str, AgentHistory]:
        async with gate:
            events = [e async for e in client.get_workflow_handle(wid).fetch_history_events()]
            history = agent_history(events)
            for step, key in history.failed.items():
                with contextlib.suppress(RPCError):  # no reconciliation: a definite failure
                    desc = await client.get_workflow_handle(reconcile_id(key)).describe()
                    started = desc.start_time.timestamp()
                    history.settled[step] = min(history.settled.get(step, started), started)
        return wid, history

    return dict(await asyncio.gather(*(one(w) for w in workflow_ids)))


def agent_history(events: Sequence[Any]) -> AgentHistory:
    """Fold one agent's history events."""
    out = AgentHistory(settled={})
    step: str | None = None
    keys: dict[str, str] = {}
    for ev in events:
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = ev.activity_task_scheduled_event_attributes
            step = attrs.activity_id
            with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
                keys[step] = json.loads(attrs.input.payloads[0].data)["key"]
        elif step and ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            if step in keys:
                out.failed[step] = keys[step]
        elif step and ev.event_type in _SETTLING:
            out.settled.setdefault(step, ev.event_time.seconds + ev.event_time.nanos / 1e9)
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            kind = ev.workflow_task_timed_out_event_attributes.timeout_type
            if kind == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START:
                out.sticky_timeouts += 1
            else:
                out.task_timeouts += 1
    return out


_SETTLING = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,  # done
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED,  # unknown, routed to reconciliation
}


def interrupting(
    settled: float, attempts: list[dict[str, Any]], faults: Faults, call: tuple[str, int]
) -> list[Fault]:
    """The faults, before the call settled, that struck an attempt of its tool activity while
    it ran (a kill, a freeze or a cut of its process, or a server kill: an attempt that
    started before and had not ended), and a lost response to its payment."""
    hits = {id(f): f for f in faults.provider.get(call, []) if f.t < settled}
    for a in attempts:
        if a["kind"] != "call":
            continue
        for f in [*faults.by_pid.get(a["pid"], []), *faults.server]:
            running = not a["ended"] or a["end"] > f.t
            if a["t"] < f.t < settled and running and (f.kind != "worker" or not a["ended"]):
                hits[id(f)] = f
    return sorted(hits.values(), key=lambda f: f.t)


@dataclass
class Faults:
    """The faults of one soak, indexed for :func:`interrupting`."""

    all: list[Fault]

    def __post_init__(self) -> None:
        self.by_pid: dict[int, list[Fault]] = defaultdict(list)
        self.server: list[Fault] = []
        self.provider: dict[tuple[str, int], list[Fault]] = defaultdict(list)
        for f in self.all:
            if f.kind == "server":
                self.server.append(f)
            elif f.kind == "provider" and f.call is not None:
                self.provider[f.call].append(f)
            elif f.pid is not None:
                self.by_pid[f.pid].append(f)


@dataclass
class Tally:
    """Running counts over the calls of one soak, in all and by the kind of fault that hit
    them (``none``: no fault struck the call)."""

    calls: int = 0
    duplicates: int = 0
    lost: int = 0
    unknown: int = 0
    wrong_receipts: int = 0
    waiting: int = 0
    """Calls of runs that wait for a person's verdict on another call of theirs (parked)."""

    def __post_init__(self) -> None:
        self.problems: list[str] = []
        self.settle: dict[str, list[float]] = defaultdict(list)
        self.agent: dict[str, list[float]] = defaultdict(list)
        self.slow: list[tuple[float, float, str, str, str]] = []
        self.by_fault: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"calls_hit": 0, "duplicates": 0, "lost": 0, "unknown": 0, "settle": []}
        )
        self.unknowns: list[dict[str, Any]] = []

    def call(
        self,
        account: str,
        tool: str,
        row: dict[str, Any] | None,
        ids: list[int],
        parked: str | None,
        kinds: set[str],
        waits: bool = False,
    ) -> None:
        """Count one call: its payments at the bank, and how it ended (None: run unfinished;
        ``waits``: unfinished because one of its calls is parked for a person, listed with its
        reason: that one counts as unknown, the others of the run as ``waiting``), under each
        kind of fault that struck it."""
        before = (self.duplicates, self.lost, self.unknown)
        self.calls += 1
        self.duplicates += max(0, len(ids) - 1)
        if len(ids) > 1:
            self.problems.append(f"{account} {tool}: {len(ids)} payments {ids} ({kinds})")
        if row is None and waits:  # its run waits for a person's verdict on a parked call
            if parked:
                row = {"step": f"{tool}#1", "outcome": "unknown", "reason": "(the run waits)"}
                self.unknown += 1
            else:
                self.waiting += 1
        elif row is None:
            self.lost += 1
            self.problems.append(f"{account} {tool}: its run did not finish")
        elif not self._ended(account, row, ids, parked):
            self.lost += 1
        if row is not None and row["outcome"] == "unknown":
            why = {"reason": parked, "agent_reason": row.get("reason"), "faults": sorted(kinds)}
            self.unknowns.append({"account": account, "step": row["step"], **why})
        after = (self.duplicates, self.lost, self.unknown)
        for kind in kinds or {"none"}:
            c = self.by_fault[kind]
            c["calls_hit"] += 1
            for name, b, a in zip(("duplicates", "lost", "unknown"), before, after, strict=True):
                c[name] += a - b

    def _ended(self, account: str, row: dict[str, Any], ids: list[int], parked: str | None) -> bool:
        """Done with its payment at the bank, or parked with its reason (listed)."""
        where = f"{account} {row['step']}"
        if row["outcome"] == "done":
            if not ids:
                self.problems.append(f"{where}: done, but the bank has no payment")
                return False
            if row["payment_id"] not in ids:
                self.wrong_receipts += 1
                self.problems.append(f"{where}: receipt {row['payment_id']} is not the bank's")
            return True
        if row["outcome"] == "unknown":
            self.unknown += 1
            if not parked:
                self.problems.append(f"{where}: unknown, but not listed as parked with a reason")
            return bool(parked)
        self.problems.append(f"{where}: {row.get('error')}: {row.get('reason')}"[:300])
        return False

    def timing(self, account: str, row: dict[str, Any], settled: float, hits: list[Fault]) -> None:
        """From the last fault that struck the call to the call settled, under that fault's
        kind when only faults of that kind struck it, else under ``mixed`` (a server outage
        after a kill would make the kill look slow)."""
        fault = hits[-1]
        s, a = settled - fault.t, row["settled_at"] - fault.t
        alone = len({f.kind for f in hits}) == 1
        self.by_fault[fault.kind if alone else "mixed"]["settle"].append(s)
        if fault.kind == "worker" and alone:  # the killed-worker figures, as before
            self.settle[row["tool"]].append(s)
            self.agent[row["tool"]].append(a)
            self.slow.append((round(s, 2), round(a, 2), account, row["step"], row["outcome"]))


def tally(
    tag: str,
    runs: int,
    orders: Sequence[Sequence[str]],
    results: dict[int, Any],
    payments: list[dict[str, Any]],
    parked: dict[tuple[str, str], str],
    attempts: Attempts,
    agents: dict[str, AgentHistory],
    faults: list[Fault],
    bound: float,
) -> dict[str, Any]:
    """The soak's figures from the runs' results, the bank's ledger, the parked list, the
    agents' histories and the faults."""
    index = Faults(faults)
    booked: dict[tuple[str, int], list[int]] = defaultdict(list)
    for p in payments:
        booked[(p["to_account"], p["amount"])].append(p["id"])
    t = Tally()
    held = {acct for (acct, _), why in parked.items() if why}  # runs with a call parked
    for i in range(runs):
        account, out = f"{tag}-{i}", results.get(i)
        if not isinstance(out, list) and account not in held:
            t.problems.append(f"{account}: {out!r}"[:300])
        for amount, tool in enumerate(orders[i % len(orders)], start=1):
            row = out[amount - 1] if isinstance(out, list) else None
            history = agents.get(account)
            when = history.settled.get(f"{tool}#1") if history else None
            tried = attempts.get((account, f"{tool}#1"), [])
            hits = interrupting(when or float("inf"), tried, index, (account, amount))
            for f in hits:
                f.hit += 1
            ids = booked.get((account, amount), [])
            why = parked.get((account, f"{tool}#1"))
            t.call(account, tool, row, ids, why, {f.kind for f in hits}, waits=account in held)
            if row is not None and when is not None and hits:
                t.timing(account, row, when, hits)
    report = figures(t, faults, bound)
    report["agent_task_timeouts"] = {
        "sticky_schedule_to_start": sum(h.sticky_timeouts for h in agents.values()),
        "start_to_close": sum(h.task_timeouts for h in agents.values()),
    }
    return report


def figures(t: Tally, faults: list[Fault], bound: float) -> dict[str, Any]:
    settle = [v for vs in t.settle.values() for v in vs]
    agent = [v for vs in t.agent.values() for v in vs]
    kills = [f for f in faults if f.kind == "worker"]
    injected: dict[str, int] = defaultdict(int)
    for f in faults:
        injected[f.kind] += 1
    by_fault = {}
    for kind in sorted(set(injected) | set(t.by_fault)):
        c = t.by_fault[kind]
        by_fault[kind] = {
            "injected": injected.get(kind, 0),
            **{k: v for k, v in c.items() if k != "settle"},
            "settle_p50_s": pct(c["settle"], 50),
            "settle_p95_s": pct(c["settle"], 95),
            "settle_max_s": summary(c["settle"])["max_s"],
        }
    return {
        "runs": None,  # filled in by the caller
        "calls": t.calls,
        "kills": len(kills),
        "duplicates": t.duplicates,
        "lost": t.lost,
        "unknown": t.unknown,
        "waiting": t.waiting,
        "settle_p50_s": pct(settle, 50),
        "settle_p95_s": pct(settle, 95),
        "settle_max_s": summary(settle)["max_s"],
        "settle_bound_s": bound,
        "settled_over_bound": sum(v > bound for v in settle),
        "agent_p50_s": pct(agent, 50),
        "agent_p95_s": pct(agent, 95),
        "agent_max_s": summary(agent)["max_s"],
        "calls_interrupted": len(settle),
        "kills_that_interrupted": sum(k.hit > 0 for k in kills),
        "wrong_receipts": t.wrong_receipts,
        "by_fault": by_fault,
        "unknown_calls": t.unknowns,
        "settle_by_tool": {k: summary(v) for k, v in sorted(t.settle.items())},
        "agent_by_tool": {k: summary(v) for k, v in sorted(t.agent.items())},
        "slowest": sorted(t.slow, reverse=True)[:10],
        "slowest_to_agent": sorted(t.slow, key=lambda r: r[1], reverse=True)[:10],
        "problems": t.problems[:50],
    }


def print_report(r: dict[str, Any]) -> None:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(json.dumps({k: r[k] for k in HEADLINE}))
    print(
        f"wall {r['wall_s']} s; {r['calls_interrupted']} calls interrupted by "
        f"{r['kills_that_interrupted']} of {r['kills']} kills; {r['approvals']} approvals"
    )
    print(
        f"SIGKILL -> call settled: p50 {s(r['settle_p50_s'])} s, p95 {s(r['settle_p95_s'])} s, "
        f"max {s(r['settle_max_s'])} s; bound (heartbeat timeout + 2 s) "
        f"{r['settle_bound_s']:.1f} s: {r['settled_over_bound']} calls over it"
    )
    print(
        f"SIGKILL -> agent has the outcome: p50 {s(r['agent_p50_s'])} s, "
        f"p95 {s(r['agent_p95_s'])} s, max {s(r['agent_max_s'])} s"
    )
    print(f"  {'tool':<14} {'n':>4}  settled p50 / p95 / max    agent p50 / p95 / max")
    for tool, st in r["settle_by_tool"].items():
        ag = r["agent_by_tool"][tool]
        print(
            f"  {tool:<14} {st['n']:>4}  {s(st['p50_s']):>6} {s(st['p95_s']):>6} "
            f"{s(st['max_s']):>6}       {s(ag['p50_s']):>6} {s(ag['p95_s']):>6} {s(ag['max_s']):>6}"
        )
    wt = r["agent_task_timeouts"]
    print(
        f"agent workflow tasks delayed by a dead worker: {wt['sticky_schedule_to_start']} on its "
        f"sticky queue, {wt['start_to_close']} held by it (workflow task timeout)"
    )
    head = f"{'fault':<10} {'injected':>8} {'hit':>5} {'dup':>4} {'lost':>4} {'unknown':>7}"
    print(f"  {head}  settle p50 / p95 / max")
    for kind, c in r["by_fault"].items():
        print(
            f"  {kind:<10} {c['injected']:>8} {c['calls_hit']:>5} {c['duplicates']:>4} "
            f"{c['lost']:>4} {c['unknown']:>7}  {s(c['settle_p50_s']):>6} "
            f"{s(c['settle_p95_s']):>6} {s(c['settle_max_s']):>6}"
        )
    for u in r["unknown_calls"]:
        print(
            f"  unknown {u['account']} {u['step']} ({', '.join(u['faults']) or 'no fault'}): "
            f"{u['reason']}"[:240]
        )
    for line in r["problems"]:
        print(f"  PROBLEM {line}")
