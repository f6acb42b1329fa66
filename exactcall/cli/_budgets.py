"""``exactcall budgets`` and ``exactcall budgets show NAME``: what each budget has spent."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from exactcall._wire import BUDGET_STATE_QUERY, budget_id
from exactcall.budgets._budget import BudgetView, Charge, ledgers

__all__ = ["add_parsers", "ledgers", "run", "view"]

EXIT_OK, EXIT_USAGE = 0, 2


def add_parsers(sub: Any, connection_args: Any) -> None:
    b = sub.add_parser("budgets", help="each budget: spent, reserved, limit, calls (show: charges)")
    b.add_argument("--json", action="store_true")
    connection_args(b)
    bsub = b.add_subparsers(dest="budgets_command")
    s = bsub.add_parser("show", help="every charge of one budget")
    s.add_argument("name")
    s.add_argument("--workflow", metavar="ID", help="a workflow-scope budget's workflow id")
    s.add_argument("--window", metavar="W", help="one window (its start, as listed)")
    s.add_argument("--json", action="store_true", dest="show_json")
    connection_args(s)


async def view(client: Client, name: str, workflow_id: str | None = None) -> BudgetView:
    """One budget's ledger, with its charges (``workflow_id`` for a workflow-scope budget).
    A query: a worker of the ledger's task queue (its first caller's) must be running."""
    return await _query(client, budget_id(name, workflow_id), True)


async def _query(client: Client, ledger: str, with_charges: bool) -> BudgetView:
    return await client.get_workflow_handle(ledger).query(
        BUDGET_STATE_QUERY, with_charges, result_type=BudgetView
    )


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _who(ledger: str) -> str:
    _, at, wid = ledger.partition("@")
    return wid if at else "namespace"


def _state(c: Charge) -> str:
    if c.overrun:
        return "overrun" if c.state == "spent" else f"overrun ({c.state})"
    return c.state


async def run(ns: argparse.Namespace, client: Client) -> int:
    if ns.budgets_command == "show":
        return await _show(ns, client)
    rows = [(lid, v) async for lid, v in ledgers(client)]
    if ns.json:
        out = [
            {"ledger": lid, "scope_of": _who(lid), **v.model_dump(mode="json")} for lid, v in rows
        ]
        print(json.dumps(out, indent=2))
        return EXIT_OK
    if not rows:
        print("No budget has been charged yet (a budget's ledger starts at its first call).")
        return EXIT_OK
    wb = max(20, *(len(v.budget) for _, v in rows))
    ws = max(10, *(len(_who(lid)) for lid, _ in rows))
    print(
        f"{'BUDGET':<{wb}} {'FOR':<{ws}} {'WINDOW':<21} {'SPENT':>9} {'RESERVED':>9} "
        f"{'LIMIT':>9} {'CALLS':>6} {'OVERRUNS':>8}"
    )
    for lid, v in rows:
        for w in v.windows or []:
            print(
                f"{v.budget:<{wb}} {_who(lid):<{ws}} {w.window:<21} {_n(w.spent):>9} "
                f"{_n(w.reserved):>9} {_n(w.limit):>9} {w.calls:>6} {w.overruns:>8}"
            )
    return EXIT_OK


async def _show(ns: argparse.Namespace, client: Client) -> int:
    try:
        v = await view(client, ns.name, ns.workflow)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            print(
                f"exactcall budgets show: the ledger of {ns.name!r} did not answer ({exc}): "
                "its charges are read from a worker of its task queue; `exactcall budgets` "
                "shows its totals without one",
                file=sys.stderr,
            )
            return 1
        where = f" for workflow {ns.workflow}" if ns.workflow else ""
        hint = "" if ns.workflow else " (a workflow-scope budget needs --workflow ID)"
        print(
            f"exactcall budgets show: no running ledger of budget {ns.name!r}{where}{hint}; "
            "`exactcall budgets` lists them",
            file=sys.stderr,
        )
        return EXIT_USAGE
    charges = [c for c in v.charges if ns.window is None or c.window == ns.window]
    if ns.show_json:
        print(json.dumps([c.model_dump(mode="json") for c in charges], indent=2))
        return EXIT_OK
    for w in v.windows:
        if ns.window is None or w.window == ns.window:
            print(
                f"{v.budget} window {w.window}: {_n(w.spent)} spent, {_n(w.reserved)} reserved, "
                f"limit {_n(w.limit)}, {w.calls} calls, {w.overruns} overruns"
            )
    for w in v.windows:
        listed = sum(1 for c in charges if c.window == w.window and c.state != "released")
        if (ns.window is None or w.window == ns.window) and w.calls > listed:
            print(
                f"  {w.calls - listed} earlier charges of window {w.window} are in its totals "
                "only (the ledger keeps their keys, not their rows; `exactcall audit` lists "
                "every call)"
            )
    if not charges:
        print("  no charges")
        return EXIT_OK
    wf = max(12, *(len(c.workflow_id) for c in charges))
    st = max(12, *(len(c.step) for c in charges))
    print(f"  {'WORKFLOW':<{wf}} {'STEP':<{st}} {'MEASURE':>8} {'STATE':<20} APPROVED BY")
    for c in sorted(charges, key=lambda c: c.at):
        who = ", ".join(c.approved_by)
        print(f"  {c.workflow_id:<{wf}} {c.step:<{st}} {_n(c.measure):>8} {_state(c):<20} {who}")
    return EXIT_OK
