"""The ``exactcall`` command: ``server``, ``worker``, ``demo``.

A thin layer over the Python API: ``main(argv) -> int``. Exit 0 ok, 1 when the answer is
"something is wrong", 2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

__all__ = ["entry", "main"]


def entry() -> None:
    """Console-script entry: run, flush, and leave without interpreter finalisation.

    Processes that used the Temporal client can crash while the interpreter finalises
    (temporalio/sdk-python#300); the exit code must be the command's own.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _connection_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "connection (defaults from TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, "
        "TEMPORAL_TLS_* or the temporal CLI profile)"
    )
    g.add_argument("--address", help="host:port of the Temporal frontend (localhost:7233)")
    g.add_argument("--namespace", help="Temporal namespace (default)")
    g.add_argument("--api-key", help="API key (Temporal Cloud); implies TLS")
    g.add_argument("--tls", action="store_true", help="connect with TLS")
    g.add_argument("--tls-cert", type=Path, help="client certificate (mTLS)")
    g.add_argument("--tls-key", type=Path, help="client private key (mTLS)")
    g.add_argument("--tls-ca", type=Path, help="server CA certificate")


def _connection(ns: argparse.Namespace):  # type: ignore[no-untyped-def]
    from exactcall._worker import Connection

    return Connection(
        address=ns.address,
        namespace=ns.namespace,
        api_key=ns.api_key,
        tls=ns.tls,
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        tls_ca=ns.tls_ca,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="exactcall", description="Exactly-once side effects for agent tool calls on Temporal."
    )
    p.add_argument("--log-level", default=os.environ.get("EXACTCALL_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("server", help="run the embedded Temporal dev server (SQLite, no Docker)")
    s.add_argument("--port", type=int, default=7233)
    s.add_argument("--ui-port", type=int, default=None, help="Temporal UI port (port+1000)")
    s.add_argument("--headless", action="store_true", help="no Temporal UI")
    s.add_argument("--db", type=Path, default=None, help="SQLite file (in the state folder)")
    s.add_argument("--namespace", action="append", default=[], help="extra namespace")
    s.add_argument("--ip", default="127.0.0.1")

    from exactcall.cli import _telemetry

    w = sub.add_parser("worker", help="run a worker for your workflows and tools")
    w.add_argument("--task-queue", required=True)
    w.add_argument(
        "--workflows",
        action="append",
        default=[],
        metavar="MODULE[:CLASS]",
        help="workflow classes to serve (repeatable, or comma-separated)",
    )
    w.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE",
        help="modules whose @exactcall.tool functions (and plain @activity.defn functions) to "
        "serve (repeatable, or comma-separated)",
    )
    w.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="another Temporal plugin for the client and worker, after exactcall's (an agent "
        "framework's, e.g. a function returning OpenAIAgentsPlugin(...)); repeatable",
    )
    w.add_argument(
        "--mcp-server",
        action="append",
        default=[],
        metavar="NAME=COMMAND|URL",
        help="an MCP server for exactcall.mcp.tool tools: a stdio command (split like a "
        "shell) or a streamable HTTP URL; repeatable (needs exactcall[mcp])",
    )
    w.add_argument(
        "--mcp-trusted",
        action="append",
        default=[],
        metavar="NAME",
        help="trust this --mcp-server's readOnlyHint annotations (for tools defined with "
        "read_only=None); repeatable",
    )
    w.add_argument(
        "--sticky-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="sticky queue schedule-to-start timeout (Temporal's default is 10 s)",
    )
    w.add_argument(
        "--max-cached-workflows",
        type=int,
        default=None,
        help="workflows kept in memory (each waiting approval holds one; Temporal's default "
        "is 1000)",
    )
    w.add_argument(
        "--workflow-task-pollers",
        type=int,
        default=None,
        help="concurrent workflow-task polls (raise it when many calls wait at once)",
    )
    w.add_argument("--max-concurrent-activities", type=int, default=None)
    w.add_argument(
        "--passthrough-all-modules",
        action="store_true",
        help="do not re-import modules inside the workflow sandbox per workflow run (less CPU "
        "and memory per cached workflow; your workflow modules must then keep no state that "
        "changes between runs: see docs/worker.md, Many pending calls)",
    )
    _telemetry.add_args(w)
    _connection_args(w)

    from exactcall.approvals import _cli as _cli_approvals
    from exactcall.cli import _resolve

    _cli_approvals.add_parsers(sub, _connection_args)
    _resolve.add_parsers(sub, _connection_args)
    from exactcall.cli import _mcp

    _mcp.add_parsers(sub, _connection_args)
    from exactcall.cli import _audit, _budgets, _undo

    _audit.add_parsers(sub, _connection_args)
    _budgets.add_parsers(sub, _connection_args)
    _undo.add_parser(sub, _connection_args)
    from exactcall.cli import _keys

    _keys.add_parsers(sub)
    from exactcall.inbox import _cli as _cli_inbox

    _cli_inbox.add_parser(sub, _connection_args)

    rp = sub.add_parser("replay", help="replay stored histories; check nondeterminism and intents")
    rp.add_argument("paths", nargs="+", metavar="PATH", help="history JSON files or folders")
    rp.add_argument(
        "--workflows", action="append", default=[], metavar="MODULE[:CLASS]", required=True
    )
    rp.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE",
        help="modules to import first (tools used by the workflows)",
    )
    rp.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="another Temporal plugin the workflows ran with (an agent framework's); repeatable",
    )
    rp.add_argument(
        "--namespace", help="namespace the histories ran in (default: from the recorded intents)"
    )
    rp.add_argument("--json", action="store_true")

    df = sub.add_parser(
        "diff", help="the tool calls of two runs side by side (exit 1 when a side effect differs)"
    )
    df.add_argument(
        "a",
        metavar="A",
        help="a workflow id (its latest run), ID:RUN_ID, session:ID (an exactcall.session's "
        "calls), or a file",
    )
    df.add_argument("b", metavar="B", help="the same, for the other run")
    df.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE",
        help="modules with the tools: for histories from before calls said whether they "
        "were reads, their read_only= tells",
    )
    df.add_argument("--json", action="store_true")
    _connection_args(df)

    h = sub.add_parser("history", help="workflow histories")
    hsub = h.add_subparsers(dest="history_command", required=True)
    ex = hsub.add_parser("export", help="write a workflow's history as JSON (for replay tests)")
    ex.add_argument("workflow")
    ex.add_argument("--run-id")
    ex.add_argument("-o", "--output", type=Path, help="file (default: stdout)")
    _connection_args(ex)

    c = sub.add_parser("chaos", help="lose API responses on purpose: do agents repeat actions?")
    up = c.add_mutually_exclusive_group(required=True)
    up.add_argument("--upstream", metavar="URL", help="the API to forward requests to")
    up.add_argument("--mock", action="store_true", help="answer with a built-in mock API instead")
    c.add_argument(
        "--fault",
        choices=["drop-response", "error-after-commit", "late-response"],
        default="drop-response",
        help="how the first response to each write is lost",
    )
    c.add_argument(
        "--late-by",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="late-response: how long the first answer is held after the API committed",
    )
    c.add_argument("--port", type=int, default=0, help="proxy port (default: a free one)")
    c.add_argument("--json", action="store_true")
    c.add_argument(
        "cmd",
        nargs="*",
        metavar="-- COMMAND",
        help="the agent to run; it finds the proxy in EXACTCALL_CHAOS_URL",
    )

    ct = sub.add_parser("crashtest", help="kill the worker at every boundary; count executions")
    ct.add_argument("target", nargs="?", metavar="MODULE:WORKFLOW")
    ct.add_argument("--demo", action="store_true", help="crash-test the shipped demo agent")
    ct.add_argument("--tools", action="append", default=[], metavar="MODULE")
    ct.add_argument(
        "--workflows",
        action="append",
        default=[],
        metavar="MODULE",
        help="other workflow modules the worker must serve",
    )
    ct.add_argument("--input", help="the workflow's argument (JSON; a list for several)")
    ct.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="a Temporal plugin for the client and every worker (an agent framework's)",
    )
    ct.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        metavar="SECONDS",
        help="how long one run may take before it counts as not finished (default 240)",
    )
    ct.add_argument("--concurrency", type=int, default=3)
    ct.add_argument("--json", action="store_true")
    ct.add_argument("--address", help="use this Temporal server instead of the embedded one")
    ct.add_argument("--namespace", default="default")

    q = sub.add_parser(
        "quickstart",
        help="each installed agent framework: a real crash, with and without exactcall",
    )
    q.add_argument(
        "frameworks",
        nargs="*",
        metavar="FRAMEWORK",
        help="openai-agents, pydantic-ai, langgraph (default: every one installed)",
    )
    q.add_argument("--json", action="store_true")

    dr = sub.add_parser("doctor", help="versions, the server and its search attributes (no upload)")
    dr.add_argument("--json", action="store_true")
    dr.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE",
        help="also check these modules' tools (approval options that need signed approvals)",
    )
    _connection_args(dr)

    d = sub.add_parser("demo", help="show a crash with and without exactcall, side by side")
    d.add_argument("--keep", action="store_true", help="keep the demo's bank database")
    _connection_args(d)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from exactcall._log import configure_logging

    configure_logging(ns.log_level.upper())
    try:
        if ns.command == "server":
            return _server(ns)
        if ns.command == "worker":
            return asyncio.run(_worker(ns))
        if ns.command in (
            "approvals",
            "approve",
            "deny",
            "unresolved",
            "resolve",
            "budgets",
            "undo",
        ):
            return asyncio.run(_client_command(ns))
        if ns.command == "keys":
            from exactcall.cli import _keys

            return _keys.run(ns)
        if ns.command == "inbox":
            from exactcall.inbox import _cli as _cli_inbox

            return _cli_inbox.run(ns, _connection(ns))
        if ns.command == "crashtest":
            from exactcall.dev._crashtest import main as crashtest

            return asyncio.run(crashtest(ns))
        if ns.command == "replay":
            return asyncio.run(_replay(ns))
        if ns.command == "diff":
            return asyncio.run(_diff(ns))
        if ns.command == "audit":
            from exactcall.cli import _audit

            if ns.audit_command == "verify":
                return _audit.verify_command(ns)
            return asyncio.run(_audit.run(ns, _connection(ns)))
        if ns.command == "history":
            return asyncio.run(_history_export(ns))
        if ns.command == "chaos":
            from exactcall.dev._chaos import run_chaos

            return run_chaos(
                ns.cmd, ns.upstream, ns.fault, ns.port, as_json=ns.json, late_by=ns.late_by
            )
        if ns.command == "mcp":
            from exactcall.cli._mcp import run as run_mcp

            return run_mcp(ns, _connection(ns) if ns.mcp_command in ("proxy", "serve") else None)
        if ns.command == "quickstart":
            from exactcall.quickstart.run import run_quickstart

            return asyncio.run(run_quickstart(ns.frameworks, as_json=ns.json))
        if ns.command == "doctor":
            from exactcall.dev._doctor import run_doctor

            sys.path.insert(0, os.getcwd())
            tools = _split(ns.tools)
            return asyncio.run(run_doctor(_connection(ns), tools=tools, as_json=ns.json))
        if ns.command == "demo":
            from exactcall.demo.run import run_demo

            return asyncio.run(run_demo(_connection(ns), keep=ns.keep))
    except KeyboardInterrupt:
        return 130
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        print(f"exactcall {ns.command}: {exc}", file=sys.stderr)
        return 2
    return 2


async def _client_command(ns: argparse.Namespace) -> int:
    from exactcall._worker import connect
    from exactcall.approvals import _cli as _cli_approvals
    from exactcall.cli import _resolve

    if ns.command in ("unresolved", "resolve"):  # may use the MCP proxies' embedded server
        return await _resolve.main(ns, _connection(ns))
    try:
        client = await connect(_connection(ns))
    except RuntimeError as exc:
        print(f"exactcall: cannot reach Temporal: {exc}", file=sys.stderr)
        return 1
    if ns.command in ("unresolved", "resolve"):
        return await _resolve.run(ns, client)
    if ns.command == "budgets":
        from exactcall.cli import _budgets

        return await _budgets.run(ns, client)
    if ns.command == "undo":
        from exactcall.cli import _undo

        return await _undo.run(ns, client)
    return await _cli_approvals.run(ns, client)


async def _diff(ns: argparse.Namespace) -> int:
    import json

    from temporalio.service import RPCError

    from exactcall._worker import connect, load_tools
    from exactcall.evidence._diff import calls_of, diff_calls

    sys.path.insert(0, os.getcwd())
    load_tools(_split(ns.tools))
    files = [Path(x).suffix == ".json" or Path(x).exists() for x in (ns.a, ns.b)]
    client = None if all(files) else await connect(_connection(ns))
    conv = client.data_converter if client is not None else _default_converter()
    try:
        a = await calls_of(ns.a, conv, client)
        b = await calls_of(ns.b, conv, client)
    except ValueError as exc:
        print(f"exactcall diff: {exc}", file=sys.stderr)
        return 2
    except RPCError as exc:
        print(f"exactcall diff: {exc} (is the workflow id right?)", file=sys.stderr)
        return 2
    d = diff_calls(a, b)
    if ns.json:
        print(json.dumps({"same": d.same, "steps": [s.as_json() for s in d.steps]}, indent=2))
    else:
        print(d.text())
    return 0 if d.same else 1


def _default_converter():  # type: ignore[no-untyped-def]
    from exactcall._plugin import choose_data_converter

    return choose_data_converter(None)


async def _replay(ns: argparse.Namespace) -> int:
    import json

    from exactcall._worker import load_plugins, load_tools, load_workflows
    from exactcall.evidence._replay import replay_histories

    sys.path.insert(0, os.getcwd())
    try:
        others = load_plugins(ns.plugin)
    except (ValueError, TypeError) as exc:
        print(f"exactcall replay: {exc}", file=sys.stderr)
        return 2
    load_tools(_split(ns.tools))
    workflows = load_workflows(_split(ns.workflows))
    paths: list[Path] = []
    for p in map(Path, ns.paths):
        paths += sorted(p.glob("*.json")) if p.is_dir() else [p]
    if not paths:
        print("exactcall replay: no history files", file=sys.stderr)
        return 2
    reports = await replay_histories(paths, workflows, namespace=ns.namespace, plugins=others)
    if ns.json:
        print(json.dumps([r.__dict__ for r in reports], indent=2))
    else:
        for r in reports:
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.path} ({r.workflow_id}, {r.calls} calls)")
            for problem in r.problems:
                print(f"     {problem}")
            for note in r.notes:
                print(f"     note: {note}")
    return 0 if all(r.ok for r in reports) else 1


async def _history_export(ns: argparse.Namespace) -> int:
    import json

    from exactcall._worker import connect

    client = await connect(_connection(ns))
    history = await client.get_workflow_handle(ns.workflow, run_id=ns.run_id).fetch_history()
    text = json.dumps(history.to_json_dict(), indent=1) + "\n"
    if ns.output:
        ns.output.write_text(text)
        print(f"wrote {ns.output} ({len(history.events)} events)")
    else:
        sys.stdout.write(text)
    return 0


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _server(ns: argparse.Namespace) -> int:
    from exactcall.embedded._server import DevServer, state_dir

    db = ns.db or state_dir() / "temporal.db"
    server = DevServer(
        port=ns.port,
        ui_port=ns.ui_port,
        headless=ns.headless,
        db=db,
        namespaces=ns.namespace,
        ip=ns.ip,
        fast=False,
        log_level="warn",
    )

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)  # stop the child server on `kill` too, not only Ctrl-C
    server.start()
    print(f"Temporal dev server on {server.address} (namespace: default)")
    if server.ui_url:
        print(f"Temporal UI at {server.ui_url}")
    print(f"State: {db}")
    print("Ctrl-C to stop.", flush=True)
    try:
        return server.wait()
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        server.stop()


def _mcp_servers(options: list[str], trusted: list[str]) -> dict[str, object] | None:
    """``--mcp-server NAME=COMMAND|URL`` and ``--mcp-trusted NAME`` -> Plugin(mcp_servers=)."""
    if not options:
        if trusted:
            raise ValueError("--mcp-trusted names a --mcp-server; none was given")
        return None
    try:
        from exactcall.mcp._spec import parse_server_option, server_spec
    except ImportError as exc:
        raise ImportError(
            f"--mcp-server needs the MCP SDK ({exc}): pip install 'exactcall[mcp]'"
        ) from exc
    servers = dict(parse_server_option(o) for o in options)
    unknown = sorted(set(trusted) - set(servers))
    if unknown:
        raise ValueError(f"--mcp-trusted {unknown}: no --mcp-server has that name")
    return {n: server_spec(s, trusted=n in trusted) for n, s in servers.items()}


async def _worker(ns: argparse.Namespace) -> int:
    from exactcall._plugin import Plugin
    from exactcall._worker import (
        build_worker,
        connect,
        load_activities,
        load_plugins,
        load_tools,
        load_workflows,
        passthrough_all_runner,
        run_worker,
    )
    from exactcall.cli import _telemetry

    sys.path.insert(0, os.getcwd())
    tools = load_tools(_split(ns.tools))
    activities = load_activities(_split(ns.tools))
    workflows = load_workflows(_split(ns.workflows))
    if not tools and not workflows:
        print("exactcall worker: give --tools and/or --workflows", file=sys.stderr)
        return 2
    try:
        others = load_plugins(ns.plugin)
    except (ValueError, TypeError) as exc:
        print(f"exactcall worker: {exc}", file=sys.stderr)
        return 2
    try:
        mcp_servers = _mcp_servers(ns.mcp_server, ns.mcp_trusted)
    except (ValueError, ImportError) as exc:
        print(f"exactcall worker: {exc}", file=sys.stderr)
        return 2
    try:
        telemetry = _telemetry.client_kwargs(ns)
    except (ValueError, ImportError) as exc:
        print(f"exactcall worker: {exc}", file=sys.stderr)
        return 2
    plugin = Plugin(tools=tools, mcp_servers=mcp_servers)
    client = await connect(_connection(ns), plugin, others, **telemetry)
    sticky = timedelta(seconds=ns.sticky_timeout) if ns.sticky_timeout else None
    tuning = {
        "max_cached_workflows": ns.max_cached_workflows,
        "max_concurrent_workflow_task_polls": ns.workflow_task_pollers,
        "max_concurrent_activities": ns.max_concurrent_activities,
        "workflow_runner": passthrough_all_runner() if ns.passthrough_all_modules else None,
    }
    worker = build_worker(
        client,
        ns.task_queue,
        workflows,
        activities=activities,
        sticky_timeout=sticky,
        **{k: v for k, v in tuning.items() if v is not None},
    )
    async with _telemetry.backlog_reporting(ns, client):
        await run_worker(worker)
    return 0
