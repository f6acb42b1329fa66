"""``exactcall mcp proxy -- COMMAND...``: a stdio MCP server in front of another one.

Everything between the MCP client (this process's stdin/stdout) and the upstream server (a
child process) is forwarded as it is, line by line, except a ``tools/call`` request of a write
tool (see :mod:`exactcall.mcp._proxy_policy` for which tools are writes). The proxy answers
those itself: each one is an exactcall call in a Temporal workflow whose id is the call's
identity (:mod:`exactcall.mcp._proxy_calls`), executed by the worker this process runs, which
sends it to the upstream with the derived key in ``_meta`` ``io.exactcall/idempotency-key``.

So a retry of a write never runs it twice: concurrent identical copies run once and all get
the result, and so does an identical call made after the answer reached no client (the request
was cancelled, the client, the connection or the proxy went away; for up to
``--retry-window``). Once an answer was written to a client, an identical call is a new call
and runs (A, B, A writes three times), except for tools given ``--dedupe-window TOOL=D``,
whose identical calls within D run once. A call answered without running says so in the text
the model reads (and ``_meta`` ``io.exactcall/deduplicated: true``). A call whose outcome is
unknown (the proxy or the server died during it, or it was cancelled after it was sent and the
server did not answer) is never re-sent: it is listed by ``exactcall unresolved`` and settled
by ``exactcall resolve``; a tool given to ``--approve`` waits for ``exactcall approve`` of its
exact arguments. A request the client cancels gets no response (MCP); the cancel reaches the
server under the id the proxy sent it with. One JSONL audit line per call. The proxy's own
errors are tool errors for that request, never stray output.

Exit codes: 0 when the client closed the session or the proxy was told to stop (SIGTERM,
SIGINT); 1 when the upstream server exited on its own with an error; 2 on bad flags or when
the server command cannot be started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from temporalio import activity

import exactcall
from exactcall._server import state_dir
from exactcall._worker import Connection

from . import KEY_META, NOT_EXECUTED_META
from ._proxy_calls import Call, Caller, Reply, tool_error
from ._proxy_policy import Audit, Policy
from ._proxy_stdio import (
    ClientStdio,
    Upstream,
    UpstreamCancelled,
    UpstreamError,
    claim_stdio,
    parse,
)
from ._proxy_temporal import Temporal
from ._proxy_workflow import bind_executor, proxy_tool

__all__ = ["derive_name", "run_proxy"]

log = structlog.get_logger("exactcall")
READY_TIMEOUT = 30.0
DRAIN_TIMEOUT = 15.0
"""On shutdown, how long calls in flight get to finish (and be answered) first."""
CANCEL_GRACE = 3.0
"""How long a write cancelled after it was sent waits for the server's answer."""
RETRY_WINDOW = timedelta(minutes=10)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LAUNCHERS = {"python", "python3", "node", "npx", "uv", "uvx", "bun", "bunx", "deno", "pipx", "run"}


def derive_name(command: list[str]) -> str:
    """A stable server name from its command: its first meaningful word + a hash of it all."""
    digest = hashlib.sha256(json.dumps(command).encode()).hexdigest()[:8]
    words = [Path(command[0]).name, *command[1:]]
    main = next(
        (w for w in words if not w.startswith("-") and re.sub(r"[\d.]+$", "", w) not in _LAUNCHERS),
        words[0],
    )
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(main).name).strip("-.") or "server"
    return f"{readable[:40]}-{digest}"


def run_proxy(ns: argparse.Namespace, connection: Connection) -> Any:
    """Entry point of ``exactcall mcp proxy`` (returns the exit code, or a coroutine of it)."""
    for old, new in (("--no-dedupe", "--read-only"), ("--dedupe", "--write")):
        if getattr(ns, old.lstrip("-").replace("-", "_")):
            print(f"exactcall mcp proxy: {old} is deprecated; use {new}", file=sys.stderr)
    if ns.window is not None:
        print(
            "exactcall mcp proxy: --window is deprecated. An identical write now gets an earlier "
            "call's outcome only when it is a retry (the answer reached no client); --window "
            "now sets how long that outcome waits for one, as --retry-window does. For tools "
            "where identical calls should run once, use --dedupe-window TOOL=DURATION.",
            file=sys.stderr,
        )
    retry_window = ns.retry_window or ns.window or RETRY_WINDOW
    policy, errors = Policy.from_flags(ns)
    name = ns.name or derive_name(ns.server_command)
    if not _NAME.match(name):
        errors.append(f"--name {name!r}: use letters, digits, '_', '-' or '.' (at most 64)")
    if retry_window.total_seconds() <= 0:
        errors.append("--retry-window must be positive (e.g. 10m)")
    if errors:
        for e in errors:
            print(f"exactcall mcp proxy: {e}", file=sys.stderr)
        return 2
    return _serve(ns, connection, name, policy, retry_window)


async def _serve(
    ns: argparse.Namespace,
    connection: Connection,
    name: str,
    policy: Policy,
    retry_window: timedelta,
) -> int:
    try:
        audit = Audit(ns.audit or state_dir() / "mcp" / f"{name}.audit.jsonl")
    except OSError as exc:
        print(f"exactcall mcp proxy: cannot write the audit file: {exc}", file=sys.stderr)
        return 2
    proxy = Proxy(name, ns.server_command, policy, audit, connection, ns, retry_window)
    return await proxy.run()


class Proxy:
    """One proxy process: the two streams, the intercepted calls, the Temporal side."""

    def __init__(
        self,
        name: str,
        command: list[str],
        policy: Policy,
        audit: Audit,
        connection: Connection,
        ns: argparse.Namespace,
        retry_window: timedelta = RETRY_WINDOW,
    ) -> None:
        self.name = name
        self.policy = policy
        self.audit = audit
        self.upstream = Upstream(command)
        self.temporal = Temporal(connection, name)
        self.caller = Caller(
            name,
            retry_window,
            ns.approval_wait,
            self.temporal.task_queue,
            cli_flags=lambda: self.temporal.cli_flags,
            progress=self._progress,
        )
        self.stdio: ClientStdio | None = None
        self._calls: dict[str, tuple[asyncio.Task[None], Call]] = {}
        self._withdrawals: set[asyncio.Future[None]] = set()
        self._closing = False
        self._lists: set[str] = set()
        self._passthrough: dict[str, tuple[float, str, str | None]] = {}
        self._listed: asyncio.Task[None] | None = None

    async def run(self) -> int:
        try:
            await self.upstream.start()
        except OSError as exc:
            print(
                f"exactcall mcp proxy: cannot start {self.upstream.command[0]!r}: {exc}",
                file=sys.stderr,
            )
            return 2
        self.stdio = ClientStdio(*claim_stdio())
        bind_executor(self._execute)
        self.temporal.start()
        log.info("mcp_proxy.started", server=self.name, audit=str(self.audit.path))
        pump = asyncio.create_task(self.upstream.pump(self._from_upstream))
        reader = asyncio.create_task(self._from_client())
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):  # an MCP client's way to end a server
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({pump, reader, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        return await self._shutdown(pump, reader)

    async def _shutdown(self, pump: asyncio.Task[None], reader: asyncio.Task[None]) -> int:
        """Stop taking calls; let the calls in flight finish and be answered (bounded); the
        rest get no answer (their outcomes stay on Temporal: done, or unknown if cut off after
        they were sent, for a later identical call), never a made-up failure."""
        assert self.stdio is not None
        self._closing = True
        reader.cancel()
        if pump.done():
            log.warning(
                "mcp_proxy.upstream_exited",
                code=self.upstream.proc.returncode if self.upstream.proc else None,
            )
        if self._calls:
            await asyncio.wait({t for t, _ in self._calls.values()}, timeout=DRAIN_TIMEOUT)
        for task, call in list(self._calls.values()):
            call.cancelled = True  # not answered: a retry gets its outcome
            task.cancel()
        await self.temporal.stop()  # in-flight tool calls finish within its graceful shutdown
        code = await self.upstream.stop()
        with contextlib.suppress(Exception):
            await pump
        self.stdio.close()
        log.info("mcp_proxy.stopped", server=self.name)
        return 0 if code in (0, None) or not pump.done() else 1

    # -- client -> upstream -----------------------------------------------------------------
    async def _from_client(self) -> None:
        assert self.stdio is not None
        async for line in self.stdio.lines():
            msg = parse(line)
            if msg is not None:
                self.upstream.note_client_message(msg)
                try:
                    if await self._take(msg):
                        continue
                except Exception as exc:  # the proxy's own fault: this request fails closed
                    log.exception("mcp_proxy.internal_error", error=str(exc))
                    if msg.get("method") == "tools/call" and msg.get("id") is not None:
                        text = f"exactcall proxy: internal error ({exc}); the call was not sent"
                        self.stdio.send(_result(msg["id"], tool_error(text, "failed")))
                        continue
            await self.upstream.send_line(line)

    async def _take(self, msg: dict[str, Any]) -> bool:
        """Note what a client message means; True when the proxy answers it itself."""
        method, rid = msg.get("method"), msg.get("id")
        if method == "tools/list" and rid is not None:
            self._lists.add(_rid(rid))
        elif method == "notifications/cancelled":
            params = msg.get("params") or {}
            entry = (
                self._calls.get(_rid(params.get("requestId"))) if isinstance(params, dict) else None
            )
            if entry is not None:  # the server never saw this request id: not forwarded
                self._cancel(entry[1])
                return True
        elif method == "tools/call" and rid is not None:
            call = await self._intercept(msg)
            if call is None:
                return False
            key = _rid(rid)
            task = asyncio.create_task(self._handle(call))
            self._calls[key] = (task, call)
            task.add_done_callback(lambda _t: self._calls.pop(key, None))
            return True
        return False

    def _cancel(self, call: Call) -> None:
        """The client cancelled ``call``: it gets no response; its workflow is told, and
        cancels the call when no other caller waits for it."""
        call.cancelled = True

        async def withdraw() -> None:
            with contextlib.suppress(Exception):
                await self.caller.withdraw(await self.temporal.client(), call)

        task = asyncio.ensure_future(withdraw())
        self._withdrawals.add(task)
        task.add_done_callback(self._withdrawals.discard)

    async def _intercept(self, msg: dict[str, Any]) -> Call | None:
        """The write call in ``msg``, or None when it passes through (noted for the audit)."""
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return None
        tool, arguments = params["name"], params.get("arguments") or {}
        if self.policy.needs_listing(tool):
            await self._learn_tools()
        decision = self.policy.decide(tool)
        if decision.action == "pass" or not isinstance(arguments, dict):
            self._passthrough[_rid(msg["id"])] = (
                time.monotonic(),
                tool,
                _hash_or_none(self.name, tool, arguments),
            )
            return None
        meta = params.get("_meta")
        return Call(
            request_id=msg["id"],
            tool=tool,
            arguments=arguments,
            extra={k: v for k, v in params.items() if k not in ("name", "arguments", "_meta")},
            meta=meta if isinstance(meta, dict) else {},
            approval=decision.action == "approve",
            window=decision.window,
        )

    async def _learn_tools(self) -> None:
        """With --trusted, list the tools once (the proxy's own request) to read their hints."""
        if self._listed is None:
            self._listed = asyncio.create_task(self._list_all())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._listed), 10)

    async def _list_all(self) -> None:
        cursor: Any = None
        for _ in range(100):
            params = {"cursor": cursor} if cursor else {}
            result = await self.upstream.request(
                "tools/list", self.upstream.with_envelope(params, {})
            )
            self.policy.learn(result)
            cursor = result.get("nextCursor")
            if not cursor:
                return

    # -- upstream -> client -----------------------------------------------------------------
    def _from_upstream(self, line: bytes, msg: dict[str, Any] | None) -> None:
        assert self.stdio is not None
        if msg is not None and "method" not in msg and "id" in msg:
            self.upstream.note_server_message(msg)
            rid = _rid(msg["id"])
            if rid in self._lists:
                self._lists.discard(rid)
                self.policy.learn(msg.get("result"))
            seen = self._passthrough.pop(rid, None)
            if seen is not None:
                t0, tool, h = seen
                outcome = "passthrough" if "result" in msg else "failed"
                self.audit.write(self.name, tool, h, outcome, (time.monotonic() - t0) * 1000)
        self.stdio.send_line(line)

    def _progress(self, token: Any, n: int, message: str) -> None:
        if token is None or self.stdio is None:
            return
        params = {"progressToken": token, "progress": n, "message": message}
        self.stdio.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    # -- an intercepted call ----------------------------------------------------------------
    async def _handle(self, call: Call) -> None:
        assert self.stdio is not None
        t0 = time.monotonic()
        try:
            reply = await self._reply(call)
        except asyncio.CancelledError:
            self.audit.write(
                self.name, call.tool, None, "cancelled", (time.monotonic() - t0) * 1000
            )
            raise
        ms = (time.monotonic() - t0) * 1000
        ids = {"workflow_id": reply.workflow_id, "step": reply.step}
        if call.cancelled:  # MCP: a cancelled request gets no response
            self.audit.write(
                self.name, call.tool, reply.args_hash, "cancelled", ms, then=reply.outcome, **ids
            )
            return
        written = None
        # once the client closed its end (or we were told to stop), an answer may be written
        # into a pipe nobody reads: it is not counted as delivered, so a retry still gets it
        if reply.deliver is not None and reply.workflow_id is not None and not self._closing:
            written = self.caller.delivering(self.temporal.client, reply.workflow_id, reply.deliver)
        self.stdio.send(_result(call.request_id, reply.result), written)
        self.audit.write(self.name, call.tool, reply.args_hash, reply.outcome, ms, **ids)

    async def _reply(self, call: Call) -> Reply:
        try:
            client = await self.temporal.client()
        except Exception as exc:
            text = (
                f"exactcall proxy: Temporal is not reachable ({type(exc).__name__}: {exc}); "
                f"{call.tool} was not sent"
            )
            return Reply(tool_error(text, "failed"), "failed")
        try:
            return await self.caller.run(client, call)
        except Exception as exc:
            log.error("mcp_proxy.call_error", tool=call.tool, error=f"{type(exc).__name__}: {exc}")
            text = (
                f"exactcall proxy could not get the outcome of {call.tool} ({type(exc).__name__}:"
                f" {exc}); it may or may not have run. Send the same call again to get its "
                "outcome: it is not run again while it runs or before its answer reached you."
            )
            return Reply(tool_error(text, "unknown"), "unknown")

    async def _execute(
        self, server: str, tool: str, arguments: dict[str, Any], extra: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """The tool activity's body: send the call to this process's upstream server."""
        if server != self.name:
            raise exactcall.NotExecuted(f"this proxy serves {self.name!r}, not {server!r}")
        try:
            await asyncio.wait_for(self.upstream.ready.wait(), READY_TIMEOUT)
        except TimeoutError:
            raise exactcall.NotExecuted(
                "no MCP client session is open on this proxy yet; nothing was sent"
            ) from None
        except asyncio.CancelledError:
            raise exactcall.NotExecuted("cancelled before it was sent") from None
        if self.upstream.gone.is_set():
            raise exactcall.NotExecuted("the upstream MCP server has exited; nothing was sent")
        client_meta = self.caller.metas.get(activity.info().workflow_id, {})
        params = self.upstream.with_envelope(
            {"name": tool, "arguments": arguments, **extra}, {**client_meta, KEY_META: key}
        )
        activity.logger.info("mcp_proxy.sending %s", tool)
        try:
            result = await self.upstream.request("tools/call", params, cancel_grace=CANCEL_GRACE)
        except UpstreamCancelled as err:
            raise RuntimeError(str(err)) from None  # outcome unknown
        except UpstreamError as err:
            if isinstance(err.code, int) and -32700 <= err.code <= -32600:
                raise exactcall.NotExecuted(f"the server refused the request: {err}") from None
            raise RuntimeError(f"the server answered {err}") from None  # outcome unknown
        meta = result.get("_meta")
        if result.get("isError") and isinstance(meta, dict) and meta.get(NOT_EXECUTED_META) is True:
            raise exactcall.NotExecuted(f"the server says it did not run it: {_text(result)}")
        return result


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _rid(value: Any) -> str:
    """A JSON-RPC id as a dict key (1 and "1" stay apart)."""
    return json.dumps(value)


def _hash_or_none(server: str, tool: str, arguments: Any) -> str | None:
    try:
        return exactcall.intent_hash(
            proxy_tool, server=server, tool=tool, arguments=arguments, extra={}
        )
    except Exception:
        return None


def _text(result: dict[str, Any]) -> str:
    content = result.get("content")
    texts = (
        [c.get("text", "") for c in content if isinstance(c, dict)]
        if isinstance(content, list)
        else []
    )
    return " ".join(t for t in texts if t) or "(no text)"
