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
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import structlog
from temporalio import activity

import exactcall
from exactcall._worker import Connection
from exactcall.embedded._server import state_dir
from exactcall.mcp._meta import KEY_META, NOT_EXECUTED_META
from exactcall.mcp._proxy_calls import Call, Caller, Reply, tool_error
from exactcall.mcp._proxy_http import HttpUpstream
from exactcall.mcp._proxy_names import NAME as _NAME
from exactcall.mcp._proxy_names import derive_name, derive_url_name
from exactcall.mcp._proxy_policy import Audit, Policy
from exactcall.mcp._proxy_results import fit_to_schema
from exactcall.mcp._proxy_stdio import (
    ClientSide,
    ClientStdio,
    Upstream,
    UpstreamCancelled,
    UpstreamError,
    UpstreamNotSent,
    claim_stdio,
    parse,
    request_key,
)
from exactcall.mcp._proxy_temporal import Temporal
from exactcall.mcp._proxy_workflow import bind_executor, proxy_tool

__all__ = ["derive_name", "derive_url_name", "run_proxy"]

log = structlog.get_logger("exactcall")
READY_TIMEOUT = 30.0
DRAIN_TIMEOUT = 15.0
"""On shutdown, how long calls in flight get to finish (and be answered) first."""
CANCEL_GRACE = 3.0
"""How long a write cancelled after it was sent waits for the server's answer."""
RETRY_WINDOW = timedelta(minutes=10)


def run_proxy(ns: argparse.Namespace, connection: Connection) -> Any:
    """Entry point of ``exactcall mcp proxy`` and ``exactcall mcp serve`` (returns the exit
    code, or a coroutine of it)."""
    for old, new in (("--no-dedupe", "--read-only"), ("--dedupe", "--write")):
        if getattr(ns, old.lstrip("-").replace("-", "_")):
            print(
                f"exactcall mcp {ns.mcp_command}: {old} is deprecated; use {new}", file=sys.stderr
            )
    if ns.window is not None:
        print(
            "exactcall mcp proxy: --window is deprecated. An identical write now gets an earlier "
            "call's outcome only when it is a retry (the answer reached no client); --window "
            "now sets how long that outcome waits for one, as --retry-window does. For tools "
            "where identical calls should run once, use --dedupe-window TOOL=DURATION.",
            file=sys.stderr,
        )
    retry_window = ns.retry_window or ns.window or RETRY_WINDOW
    if getattr(ns, "home", None) is not None:  # before anything reads the state folder
        os.environ["EXACTCALL_HOME"] = str(ns.home.expanduser().resolve())
    policy, errors = Policy.from_flags(ns)
    name = ns.name or (derive_url_name(ns.url) if ns.url else derive_name(ns.server_command))
    if not _NAME.match(name):
        errors.append(f"--name {name!r}: use letters, digits, '_', '-' or '.' (at most 64)")
    if ns.url and urlsplit(ns.url).scheme not in ("http", "https"):
        errors.append(f"--url {ns.url!r}: give an http:// or https:// URL")
    if ns.header and not ns.url:
        errors.append("--header goes with --url (a command's server gets no HTTP headers)")
    if retry_window.total_seconds() <= 0:
        errors.append("--retry-window must be positive (e.g. 10m)")
    if not errors and not ns.name:
        print(
            f"exactcall mcp {getattr(ns, 'mcp_command', 'proxy')}: serving as {name!r} (from the "
            f"{'URL' if ns.url else 'command'}; give --name to keep it when that changes: the "
            "retry, dedupe and unresolved state is per name)",
            file=sys.stderr,
        )
    if errors:
        for e in errors:
            print(f"exactcall mcp {getattr(ns, 'mcp_command', 'proxy')}: {e}", file=sys.stderr)
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
    proxy = Proxy(name, policy, audit, connection, ns, retry_window)
    if getattr(ns, "mcp_command", "proxy") == "serve":
        from exactcall.mcp._proxy_serve import serve

        return await serve(proxy, ns)
    return await proxy.run_stdio(make_upstream(ns))


def make_upstream(ns: argparse.Namespace) -> Upstream:
    """The server a session talks to: ``--url`` (Streamable HTTP) or the command after --."""
    if getattr(ns, "url", None):
        return HttpUpstream(ns.url, dict(ns.header or []))
    return Upstream(ns.server_command)


class Proxy:
    """One proxy process: the Temporal side and its worker, the policy, the audit, and the
    MCP client sessions it serves (one over stdio; one per HTTP session with ``mcp serve``),
    each with its own upstream."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        audit: Audit,
        connection: Connection,
        ns: argparse.Namespace,
        retry_window: timedelta = RETRY_WINDOW,
    ) -> None:
        self.name = name
        self.policy = policy
        self.audit = audit
        if getattr(ns, "max_args_bytes", None):  # one proxy per process: its tool's limit
            proxy_tool.options = dataclasses.replace(
                proxy_tool.options, max_args_bytes=ns.max_args_bytes
            )
        self.temporal = Temporal(connection, name)
        self.caller = Caller(
            name,
            retry_window,
            ns.approval_wait,
            self.temporal.task_queue,
            cli_flags=lambda: self.temporal.cli_flags,
            resolve_flags=lambda: self.temporal.resolve_flags,
            progress=self._progress,
        )
        self.sessions: set[Session] = set()
        self._withdrawals: set[asyncio.Future[None]] = set()
        self._listed: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the Temporal side (in the background: a client's handshake never waits)."""
        bind_executor(self._execute)
        self.caller.send = self._send
        self.caller.get_client = self.temporal.client
        self.temporal.start()
        log.info("mcp_proxy.started", server=self.name, audit=str(self.audit.path))

    async def stop(self) -> None:
        await self.caller.drain()  # the outcomes of answered calls, to their runs
        await self.temporal.stop()  # in-flight tool calls finish within its graceful shutdown
        log.info("mcp_proxy.stopped", server=self.name)

    async def run_stdio(self, upstream: Upstream) -> int:
        """``exactcall mcp proxy``: one session, the client on this process's stdio."""
        try:
            await upstream.start()
        except OSError as exc:
            print(
                f"exactcall mcp proxy: cannot start {upstream.command[0]!r}: {exc}",
                file=sys.stderr,
            )
            return 2
        stdio = ClientStdio(*claim_stdio())
        session = Session(self, stdio, upstream)
        self.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):  # an MCP client's way to end a server
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        ended = await session.run(stop)
        await session.close(before_upstream=self.stop)
        stdio.close()
        return 1 if ended == "upstream" and upstream.failed() else 0

    def _progress(self, call: Call, n: int, message: str) -> None:
        session = call.origin
        if isinstance(session, Session):
            session.progress(call.progress_token, n, message)

    def withdraw(self, call: Call) -> None:
        """The client cancelled ``call``: it gets no response; its workflow is told, and
        cancels the call when no other caller waits for it."""
        call.cancelled = True

        async def withdraw() -> None:
            with contextlib.suppress(Exception):
                await self.caller.withdraw(await self.temporal.client(), call)

        task = asyncio.ensure_future(withdraw())
        self._withdrawals.add(task)
        task.add_done_callback(self._withdrawals.discard)

    async def learn_tools(self, upstream: Upstream) -> None:
        """With --trusted, list the tools once (the proxy's own request) to read their hints."""
        if self._listed is None or (self._listed.done() and self._listed.exception()):
            self._listed = asyncio.create_task(self._list_all(upstream))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._listed), 10)

    async def _list_all(self, upstream: Upstream) -> None:
        cursor: Any = None
        for _ in range(100):
            params = {"cursor": cursor} if cursor else {}
            result = await upstream.request("tools/list", upstream.with_envelope(params, {}))
            self.policy.learn(result)
            cursor = result.get("nextCursor")
            if not cursor:
                return

    async def reply(self, call: Call) -> Reply:
        try:
            client = await self.temporal.client()
        except Exception as exc:
            text = (
                f"exactcall proxy: Temporal is not reachable ({type(exc).__name__}: {exc}); "
                f"{call.tool} was not sent"
            )
            return Reply(tool_error(text, "failed"), "failed")
        try:
            reply = await self.caller.run(client, call)
            return await self._fitted(call, reply) if reply.settled else reply
        except Exception as exc:
            log.error("mcp_proxy.call_error", tool=call.tool, error=f"{type(exc).__name__}: {exc}")
            text = (
                f"exactcall proxy could not get the outcome of {call.tool} ({type(exc).__name__}:"
                f" {exc}); it may or may not have run. Send the same call again to get its "
                "outcome: it is not run again while it runs or before its answer reached you."
            )
            return Reply(tool_error(text, "unknown"), "unknown")

    async def _fitted(self, call: Call, reply: Reply) -> Reply:
        """A verdict's result, its structured content fitted to the tool's output schema (a
        person's plain ``--result``: see :mod:`._proxy_results`)."""
        session = call.origin
        if call.tool not in self.policy.output_schemas and isinstance(session, Session):
            await self.learn_tools(session.upstream)
        schema = self.policy.output_schemas.get(call.tool)
        return dataclasses.replace(reply, result=fit_to_schema(reply.result, schema))

    def _upstream_for(self, workflow_id: str) -> Upstream | None:
        """The upstream a call goes to: its client session's, or (that session has ended, or
        the call was started by another proxy) any session's that is open."""
        origin = self.caller.origins.get(workflow_id)
        if isinstance(origin, Session) and origin in self.sessions and origin.upstream.open:
            return origin.upstream
        open_ = [s.upstream for s in self.sessions if s.upstream.open]
        ready = [u for u in open_ if u.ready.is_set()]
        return next(iter(ready or open_), None)

    async def _execute(
        self, server: str, tool: str, arguments: dict[str, Any], extra: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """The tool activity's body (a call through ``ProxyCall``, or a reconciliation's
        re-run): send the call to an upstream of this process."""
        if server != self.name:
            raise exactcall.NotExecuted(f"this proxy serves {self.name!r}, not {server!r}")
        activity.logger.info("mcp_proxy.sending %s", tool)
        return await self._send(activity.info().workflow_id or "", tool, arguments, extra, key)

    async def _send(
        self, wid: str, tool: str, arguments: dict[str, Any], extra: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """Send a call to an upstream of this process (``wid``: the call's workflow, whose
        client session and ``_meta`` it takes); NotExecuted when it was not sent."""
        upstream = self._upstream_for(wid)
        if upstream is None:
            raise exactcall.NotExecuted(
                "no MCP client session is open on this proxy; nothing was sent"
            )
        try:
            await asyncio.wait_for(upstream.ready.wait(), READY_TIMEOUT)
        except TimeoutError:
            raise exactcall.NotExecuted(
                "no MCP client session is open on this proxy yet; nothing was sent"
            ) from None
        except asyncio.CancelledError:
            raise exactcall.NotExecuted("cancelled before it was sent") from None
        if upstream.gone.is_set():
            raise exactcall.NotExecuted("the upstream MCP server has exited; nothing was sent")
        client_meta = self.caller.metas.get(wid, {})
        params = upstream.with_envelope(
            {"name": tool, "arguments": arguments, **extra}, {**client_meta, KEY_META: key}
        )
        try:
            result = await upstream.request("tools/call", params, cancel_grace=CANCEL_GRACE)
        except UpstreamNotSent as err:
            raise exactcall.NotExecuted(str(err)) from None
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


class Session:
    """One MCP client session: its client side (stdio, or one HTTP session), its upstream,
    and the calls it took over."""

    def __init__(self, proxy: Proxy, client: ClientSide, upstream: Upstream) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self._calls: dict[str, tuple[asyncio.Task[None], Call]] = {}
        self._closing = False
        self._lists: set[str] = set()
        self._passthrough: dict[str, tuple[float, str, str | None]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """Calls it took over are in flight."""
        return bool(self._calls)

    async def run(self, stop: asyncio.Event | None = None) -> str:
        """Forward both ways until the client ends the session ("client"), the upstream goes
        away ("upstream"), or ``stop`` is set ("stop"). The upstream is started."""
        self.proxy.sessions.add(self)
        self._pump = asyncio.create_task(self.upstream.pump(self._from_upstream))
        self._reader = asyncio.create_task(self._from_client())
        waits: set[asyncio.Future[Any]] = {self._pump, self._reader}
        stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if stopped is not None:
            waits.add(stopped)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if stopped is not None:
            stopped.cancel()
        if self._pump.done():
            return "upstream"
        return "client" if self._reader.done() else "stop"

    async def close(self, before_upstream: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop taking calls; let the calls in flight finish and be answered (bounded); the
        rest get no answer (their outcomes stay on Temporal: done, or unknown if cut off after
        they were sent, for a later identical call), never a made-up failure."""
        self._closing = True
        if self._reader is not None:
            self._reader.cancel()
        if self._pump is not None and self._pump.done():
            log.warning("mcp_proxy.upstream_exited", code=self.upstream.exit_code())
        if self._calls:
            await asyncio.wait({t for t, _ in self._calls.values()}, timeout=DRAIN_TIMEOUT)
        for task, call in list(self._calls.values()):
            call.cancelled = True  # not answered: a retry gets its outcome
            task.cancel()
        if before_upstream is not None:
            await before_upstream()
        self.proxy.sessions.discard(self)
        await self.upstream.stop()
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await self._pump

    # -- client -> upstream -----------------------------------------------------------------
    async def _from_client(self) -> None:
        async for line in self.client.lines():
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
                        self.client.send(_result(msg["id"], tool_error(text, "failed")))
                        continue
            await self.upstream.send_line(line)

    async def _take(self, msg: dict[str, Any]) -> bool:
        """Note what a client message means; True when the proxy answers it itself."""
        method, rid = msg.get("method"), msg.get("id")
        if method == "tools/list" and rid is not None:
            self._lists.add(request_key(rid))
        elif method == "notifications/cancelled":
            params = msg.get("params") or {}
            entry = (
                self._calls.get(request_key(params.get("requestId")))
                if isinstance(params, dict)
                else None
            )
            if entry is not None:  # the server never saw this request id: not forwarded
                self.proxy.withdraw(entry[1])
                return True
        elif method == "tools/call" and rid is not None:
            call = await self._intercept(msg)
            if call is None:
                return False
            key = request_key(rid)
            task = asyncio.create_task(self._handle(call))
            self._calls[key] = (task, call)
            task.add_done_callback(lambda _t: self._calls.pop(key, None))
            return True
        return False

    async def _intercept(self, msg: dict[str, Any]) -> Call | None:
        """The write call in ``msg``, or None when it passes through (noted for the audit)."""
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return None
        policy = self.proxy.policy
        tool, arguments = params["name"], params.get("arguments") or {}
        if policy.needs_listing(tool):
            await self.proxy.learn_tools(self.upstream)
        decision = policy.decide(tool)
        if decision.action == "pass" or not isinstance(arguments, dict):
            self._passthrough[request_key(msg["id"])] = (
                time.monotonic(),
                tool,
                _hash_or_none(self.proxy.name, tool, arguments),
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
            origin=self,
        )

    # -- upstream -> client -----------------------------------------------------------------
    def _from_upstream(self, line: bytes, msg: dict[str, Any] | None) -> None:
        if msg is not None and "method" not in msg and "id" in msg:
            self.upstream.note_server_message(msg)
            rid = request_key(msg["id"])
            if rid in self._lists:
                self._lists.discard(rid)
                self.proxy.policy.learn(msg.get("result"))
            seen = self._passthrough.pop(rid, None)
            if seen is not None:
                t0, tool, h = seen
                outcome = "passthrough" if "result" in msg else "failed"
                self.proxy.audit.write(
                    self.proxy.name, tool, h, outcome, (time.monotonic() - t0) * 1000
                )
        self.client.send_line(line)

    def progress(self, token: Any, n: int, message: str) -> None:
        if token is None:
            return
        params = {"progressToken": token, "progress": n, "message": message}
        self.client.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    # -- an intercepted call ----------------------------------------------------------------
    async def _handle(self, call: Call) -> None:
        proxy = self.proxy
        t0 = time.monotonic()
        try:
            reply = await proxy.reply(call)
        except asyncio.CancelledError:
            proxy.audit.write(
                proxy.name, call.tool, None, "cancelled", (time.monotonic() - t0) * 1000
            )
            raise
        ms = (time.monotonic() - t0) * 1000
        ids = {"workflow_id": reply.workflow_id, "step": reply.step}
        if call.cancelled:  # MCP: a cancelled request gets no response
            proxy.caller.not_delivered(reply.workflow_id)
            proxy.audit.write(
                proxy.name, call.tool, reply.args_hash, "cancelled", ms, then=reply.outcome, **ids
            )
            return
        written = None
        # once the client closed its end (or we were told to stop), an answer may be written
        # into a pipe nobody reads: it is not counted as delivered, so a retry still gets it
        if reply.deliver is not None and reply.workflow_id is not None and not self._closing:
            written = proxy.caller.delivering(
                proxy.temporal.client, reply.workflow_id, reply.deliver
            )
        else:
            proxy.caller.not_delivered(reply.workflow_id)
        self.client.send(_result(call.request_id, reply.result), written)
        proxy.audit.write(proxy.name, call.tool, reply.args_hash, reply.outcome, ms, **ids)


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


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
