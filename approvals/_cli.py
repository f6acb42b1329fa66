"""``exactcall approvals list|show``, ``exactcall approve`` and ``exactcall deny``."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from temporalio.client import Client

from exactcall._confirm import confirm_at_terminal
from exactcall.approvals import (
    ApprovalRequest,
    DecisionResult,
    decide,
    list_pending,
    load_signing_key,
    pending,
    preapprove,
    view,
)

__all__ = ["add_parsers", "run"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_QUEUED = 0, 1, 2, 3


def add_parsers(sub: Any, connection_args: Any) -> None:
    a = sub.add_parser("approvals", help="calls waiting for a person")
    asub = a.add_subparsers(dest="approvals_command", required=True)
    lst = asub.add_parser("list", help="pending calls across workflows")
    lst.add_argument("--json", action="store_true")
    connection_args(lst)
    show = asub.add_parser("show", help="the exact canonical arguments of a pending call")
    show.add_argument("workflow")
    show.add_argument("step", nargs="?")
    show.add_argument("--json", action="store_true")
    connection_args(show)
    for verb in ("approve", "deny"):
        p = sub.add_parser(verb, help=f"{verb} a pending call (bound to its args hash)")
        p.add_argument("workflow")
        p.add_argument("step", nargs="?")
        p.add_argument("--hash", dest="args_hash", help="sha256 of the call's canonical args")
        p.add_argument("--as", dest="by", help="who decides (default: the OS user)")
        p.add_argument("--reason")
        p.add_argument("--key", dest="keyfile", help="Ed25519 private key (PEM) to sign with")
        p.add_argument("--yes", action="store_true", help="do not ask (required without a TTY)")
        if verb == "approve":
            p.add_argument("--tool", help="pre-approve: the tool of a call not reached yet")
            p.add_argument("--args", dest="args_json", help="pre-approve: its arguments (JSON)")
        connection_args(p)


async def run(ns: argparse.Namespace, client: Client) -> int:
    if ns.command == "approvals":
        if ns.approvals_command == "list":
            return await _list(client, ns.json)
        return await _show(client, ns.workflow, ns.step, ns.json)
    if ns.command == "approve" and (ns.tool or ns.args_json):
        return await _preapprove(client, ns)
    return await _decide(client, ns)


def _row(r: ApprovalRequest) -> dict[str, Any]:
    return {
        "workflow_id": r.workflow_id,
        "step": r.step,
        "tool": r.tool,
        "args": r.args,
        "args_hash": r.args_hash,
        "requested_at": r.requested_at.isoformat(),
        "expires_at": r.expires_at.isoformat(),
        "requested_by": r.requested_by,
        "approvals_needed": r.approvals_needed,
        "approved_by": list(r.approved_by),
        "reasons": list(r.reasons),
    }


async def _list(client: Client, as_json: bool) -> int:
    reqs = await list_pending(client)
    if as_json:
        print(json.dumps([_row(r) for r in reqs], indent=2))
        return EXIT_OK
    if not reqs:
        print("No calls are waiting for approval.")
        return EXIT_OK
    # columns as wide as their longest value (a framework approval's step is TOOL@CALL_ID)
    w = max(28, *(len(r.workflow_id) for r in reqs))
    st = max(18, *(len(r.step) for r in reqs))
    tl = max(14, *(len(r.tool) for r in reqs))
    print(f"{'WORKFLOW':<{w}} {'STEP':<{st}} {'TOOL':<{tl}} {'HASH':<14} EXPIRES")
    for r in reqs:
        print(
            f"{r.workflow_id:<{w}} {r.step:<{st}} {r.tool:<{tl}} {r.args_hash[:12]:<14} "
            f"{r.expires_at:%Y-%m-%d %H:%M:%S}Z"
        )
        print(f"    args {json.dumps(r.args, sort_keys=True)}")
        for why in r.reasons:
            print(f"    why  {why}")
    return EXIT_OK


def _describe(r: ApprovalRequest) -> str:
    args = json.dumps(r.args, indent=2, sort_keys=True)
    lines = [
        f"workflow   {r.workflow_id}",
        f"step       {r.step}",
        f"tool       {r.tool}",
        f"args       {args}".replace("\n", "\n           "),
        f"args hash  {r.args_hash}",
        f"requested  {r.requested_at.isoformat()}"
        + (f" by {r.requested_by}" if r.requested_by else ""),
        f"expires    {r.expires_at.isoformat()}",
    ]
    lines += [f"why        {why}" for why in r.reasons]
    if r.approvals_needed > 1:
        lines.append(f"approvals  {len(r.approved_by)} of {r.approvals_needed} {r.approved_by}")
    return "\n".join(lines)


async def _show(client: Client, workflow: str, step: str | None, as_json: bool) -> int:
    try:
        r = await pending(client, workflow, step)
    except LookupError as exc:
        print(f"exactcall: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if as_json:
        print(json.dumps(_row(r), indent=2))
    else:
        print(_describe(r))
        print(f"\napprove with: exactcall approve {workflow} {r.step} --hash {r.args_hash}")
    return EXIT_OK


def _report(res: DecisionResult) -> int:
    d = res.decision
    if res.accepted:
        print(f"{d.decision} by {d.by}: accepted ({res.outcome})")
        return EXIT_OK
    if res.queued:  # sent, not yet checked: neither accepted nor rejected
        print(f"{d.decision} by {d.by}: {res.outcome}")
        return EXIT_QUEUED
    if res.record is None:  # sent; no worker answered the confirming query in time
        print(
            f"{d.decision} by {d.by}: sent; not confirmed yet: no worker answered. The decision "
            "is in the workflow's history and is checked when a worker runs it (exit 3)",
            file=sys.stderr,
        )
        return EXIT_QUEUED
    print(f"{d.decision} by {d.by}: REJECTED: {res.outcome}", file=sys.stderr)
    return EXIT_REFUSED


async def _decide(client: Client, ns: argparse.Namespace) -> int:
    if not ns.args_hash:
        print(
            f"exactcall {ns.command}: --hash is required (see exactcall approvals show)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    given = ns.args_hash
    try:
        req = await _the_request(client, ns.workflow, ns.step, given)
    except LookupError as exc:
        last = await _last_outcome(client, ns.workflow, ns.step)
        print(f"exactcall: {exc}{last}", file=sys.stderr)
        if ns.reason and last:
            print(
                f"exactcall: your reason was not recorded: a reason is kept with the decision "
                f"that decides (give --reason to that {ns.command}); a decided call takes no "
                "later one",
                file=sys.stderr,
            )
        return EXIT_REFUSED
    print(_describe(req))
    if len(given) < HASH_LENGTH:  # a prefix, as `approvals list` prints: whose is it?
        if len(given) < MIN_PREFIX or not req.args_hash.startswith(given):
            print(
                f"\nexactcall {ns.command}: --hash {given} is not a full args hash and is not "
                f"the start of this call's ({req.args_hash}); nothing sent. Pass the full hash "
                f"(or at least {MIN_PREFIX} of its first characters): exactcall approvals show "
                f"{ns.workflow}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(f"\n--hash {given} is the start of this call's hash: {req.args_hash}")
        ns.args_hash = req.args_hash
    if ns.args_hash != req.args_hash:
        print(
            f"\nWARNING: --hash {ns.args_hash} is not the hash of these arguments; the workflow "
            "will reject (and record) this decision.",
            file=sys.stderr,
        )
    stop = confirm_at_terminal(f"\n{ns.command.capitalize()} exactly this call?", ns.yes)
    if stop is not None:
        return stop
    res = await decide(
        client,
        ns.workflow,
        ns.command,
        args_hash=ns.args_hash,
        step=req.step,
        by=ns.by or getpass.getuser(),
        reason=ns.reason,
        expires_at=req.expires_at,
        signing_key=load_signing_key(ns.keyfile) if ns.keyfile else None,
    )
    return _report(res)


HASH_LENGTH = 64
MIN_PREFIX = 8


async def _the_request(
    client: Client, workflow: str, step: str | None, given: str
) -> ApprovalRequest:
    """The pending request meant: by step, or (no step, several pending) the only one whose
    hash starts with a prefix ``given``."""
    if step is not None or len(given) >= HASH_LENGTH or len(given) < MIN_PREFIX:
        return await pending(client, workflow, step)
    reqs = (await view(client, workflow)).pending
    mine = [r for r in reqs if r.args_hash.startswith(given)]
    if len(reqs) > 1 and len(mine) == 1:
        return mine[0]
    return await pending(client, workflow, step)


async def _last_outcome(client: Client, workflow: str, step: str | None) -> str:
    try:
        v = await view(client, workflow)
    except Exception:
        return ""
    done = [r for r in v.decisions if r.accepted and (step is None or r.decision.step == step)]
    if not done:
        return ""
    d = done[-1].decision
    why = f", reason {d.reason!r}" if d.reason else ", no reason given"
    return f" (last accepted decision: {done[-1].outcome}, by {d.by}{why})"


async def _preapprove(client: Client, ns: argparse.Namespace) -> int:
    if not (ns.tool and ns.args_json):
        print("exactcall approve: a pre-approval needs both --tool and --args", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = json.loads(ns.args_json)
    except json.JSONDecodeError as exc:
        print(f"exactcall approve: --args is not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(args, dict):
        print("exactcall approve: --args must be a JSON object of named arguments", file=sys.stderr)
        return EXIT_USAGE
    from exactcall._canonical import args_hash

    h = args_hash(ns.tool, args)
    print(f"pre-approve {ns.tool}({json.dumps(args, sort_keys=True)})\nargs hash {h}")
    print(f"consumed once, by the first {ns.tool} call of {ns.workflow} with these arguments")
    stop = confirm_at_terminal("\nPre-approve exactly this call?", ns.yes)
    if stop is not None:
        return stop
    res = await preapprove(
        client,
        ns.workflow,
        ns.tool,
        args,
        by=ns.by or getpass.getuser(),
        reason=ns.reason,
        signing_key=load_signing_key(ns.keyfile) if ns.keyfile else None,
    )
    return _report(res)
