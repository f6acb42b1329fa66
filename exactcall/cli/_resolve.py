"""``exactcall unresolved`` and ``exactcall resolve``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client

from exactcall._confirm import confirm_at_terminal
from exactcall._wire import MCP_PROXY_TOOL
from exactcall.approvals._cli import EXIT_OK, EXIT_QUEUED, EXIT_REFUSED, EXIT_USAGE
from exactcall.reconciliation import (
    UnresolvedCall,
    find,
    list_failed_undos,
    list_unresolved,
    resolve,
)

__all__ = ["add_parsers", "main", "run"]

EXIT_SENT = EXIT_QUEUED  # sent, applied later: neither accepted nor refused


def add_parsers(sub: Any, connection_args: Any) -> None:
    u = sub.add_parser("unresolved", help="calls whose outcome is unknown, waiting for a person")
    u.add_argument("--json", action="store_true")
    _home_arg(u)
    connection_args(u)
    r = sub.add_parser(
        "resolve",
        help="give the verdict on an unresolved call (an unknown outcome waiting for a person)",
    )
    r.add_argument("workflow")
    r.add_argument("step")
    verdict = r.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--landed", action="store_true", help="it happened")
    verdict.add_argument("--not-landed", action="store_true", help="it did not: run it once more")
    verdict.add_argument("--abandon", action="store_true", help="give up: the call fails")
    r.add_argument("--result", help="with --landed: the call's result (JSON)")
    r.add_argument("--reason")
    r.add_argument("--as", dest="by", help="who decides (default: the OS user)")
    r.add_argument("--yes", action="store_true", help="do not ask (required without a TTY)")
    _home_arg(r)
    connection_args(r)


def _home_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--home",
        type=Path,
        help="the MCP proxies' state folder (default $EXACTCALL_HOME): with no Temporal "
        "configured, their embedded server's calls are listed and settled there, the server "
        "started for the command if no proxy runs",
    )


async def main(ns: argparse.Namespace, conn: Any) -> int:
    """Connect (to the MCP proxies' embedded server, when that is where the calls are: see
    exactcall.mcp._proxy_settle), run the command, leave the server."""
    from exactcall._worker import connect

    embedded = None
    try:
        proxies: Any
        try:
            from exactcall.mcp import _proxy_settle as proxies
        except ImportError:  # no mcp extra: no proxy ever ran here
            proxies = None
        if proxies is not None:
            conn, embedded = await proxies.embedded_for_cli(conn, ns.home, ns.command)
        try:
            client = await connect(conn)
        except RuntimeError as exc:
            print(f"exactcall: cannot reach Temporal: {exc}", file=sys.stderr)
            return 1
        if proxies is None:
            return await run(ns, client)
        async with proxies.driving_proxies(conn, client):
            return await run(ns, client)
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


def _row(u: UnresolvedCall) -> dict[str, Any]:
    return {
        "workflow_id": u.workflow_id,
        "step": u.step,
        "tool": u.tool,
        "args": u.args,
        "args_hash": u.args_hash,
        "key": u.key,
        "since": u.since.isoformat(),
        "reason": u.reason,
        "reconcile_id": u.reconcile_id,
    }


async def run(ns: argparse.Namespace, client: Client) -> int:
    if ns.command == "unresolved":
        rows = await list_unresolved(client)
        undos = await list_failed_undos(client)
        if ns.json:
            out = [{"kind": "unknown_outcome", **_row(u)} for u in rows]
            out += [{"kind": "undo_failed", **f.model_dump(mode="json")} for f in undos]
            print(json.dumps(out, indent=2))
            return EXIT_OK
        for f in undos:
            print(f"{f.workflow_id}  {f.step}  undo failed  at {f.at:%Y-%m-%d %H:%M:%S}Z")
            print(f"    why  {f.error}")
            print(f"    exactcall undo {f.workflow_id} --step {f.step}   (once the cause is fixed)")
        if not rows:
            print("No calls are waiting for a verdict.")
        else:
            for u in rows:
                print(f"{u.workflow_id}  {u.step}  {u.tool}  since {u.since:%Y-%m-%d %H:%M:%S}Z")
                print(f"    args {json.dumps(u.args, sort_keys=True)}")
                print(f"    why  {u.reason}")
                print(
                    f"    exactcall resolve {u.workflow_id} {u.step} --landed --result JSON|"
                    "--not-landed|--abandon"
                )
        return EXIT_OK
    return await _resolve(ns, client)


async def _resolve(ns: argparse.Namespace, client: Client) -> int:
    result = None
    if ns.landed and ns.result is None:
        print(
            "exactcall resolve: --landed needs --result JSON, the call's result as the tool "
            "would have returned it (the agent gets exactly that; --result null for none)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if ns.result is not None:
        if not ns.landed:
            print("exactcall resolve: --result goes with --landed", file=sys.stderr)
            return EXIT_USAGE
        try:
            result = json.loads(ns.result)
        except json.JSONDecodeError as exc:
            print(f"exactcall resolve: --result is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        row = await find(client, ns.workflow, ns.step)
    except LookupError as exc:
        print(
            f"exactcall: {exc} (it has a verdict already, or is not waiting for a person yet)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    verdict = "landed" if ns.landed else "not_landed" if ns.not_landed else "abandon"
    what = {
        "landed": "it happened; the call completes with the given result",
        "not_landed": "it did not happen; the call runs once more with the same key",
        "abandon": "give up; the call fails with CallAbandoned",
    }[verdict]
    print(f"{row.tool} {row.step} of {row.workflow_id}\n    args {json.dumps(row.args)}")
    print(f"    why  {row.reason}\nverdict: {verdict} ({what})")
    stop = confirm_at_terminal("Send this verdict?", ns.yes)
    if stop is not None:
        return stop
    res = await resolve(
        client,
        ns.workflow,
        ns.step,
        verdict,  # type: ignore[arg-type]
        result=result,
        by=ns.by or getpass.getuser(),
        reason=ns.reason,
    )
    if res.accepted:
        print(f"{verdict} by {res.resolution.by}: accepted")
        if verdict == "not_landed" and row.tool == MCP_PROXY_TOOL:
            print(
                "    a proxy of that name sends it once more, with the same key (the next one "
                "to start, if none runs now)"
            )
        return EXIT_OK
    if res.outcome is None:  # sent: Temporal keeps it, a worker applies it when it runs
        print(
            f"{verdict}: sent; not confirmed yet: no worker answered. The verdict is in the "
            "reconciliation's history and is applied when a worker runs it (exit 3)",
            file=sys.stderr,
        )
        return EXIT_SENT
    print(f"{verdict}: {res.outcome}", file=sys.stderr)
    return EXIT_REFUSED
