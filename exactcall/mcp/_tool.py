"""MCP tools as exactcall tools, and the worker's connections to MCP servers.

``tool(server, name)`` returns an exactcall :class:`~exactcall.Tool` (an :class:`McpTool`,
named ``mcp.<server>.<name>``) whose activity calls the tool ``name`` of the MCP server the
worker knows as ``server``. The worker opens each server once, on first use (a stdio command
or a streamable HTTP URL, from ``exactcall.Plugin(mcp_servers={...})``), shares it between
activities, and closes it when the worker stops. The activity finds its worker's connections
through an activity interceptor that the Plugin installs.

Outcomes: a result is returned as JSON (its structured content, else its text). An
``isError`` result with ``_meta`` ``io.exactcall/not-executed: true`` raises NotExecuted
(retried by the tool's retry policy); any other error result, or a connection lost during the
call, is an unknown outcome (reconciliation). A server that cannot be reached, or that has no
such tool, did not run anything: NotExecuted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND, CallToolResult, TextContent
from mcp.types import Tool as WireTool
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from exactcall._context import current_intent
from exactcall._errors import NotExecuted
from exactcall._tool import _REGISTRY, Tool, _options, _register
from exactcall.mcp._meta import KEY_META, NOT_EXECUTED_META
from exactcall.mcp._spec import McpServerSpec, check_server_name, server_spec

__all__ = ["McpPool", "McpTool", "McpToolError", "call_tool", "not_executed", "tool"]

log = structlog.get_logger("exactcall")

_CLOSE_TIMEOUT = 10.0
OPEN_TIMEOUT = 30.0
"""Seconds to start an MCP server and list its tools before the call counts as not sent."""


# -- the tool ----------------------------------------------------------------------------------
class McpTool(Tool):
    """An exactcall tool that calls one tool of an MCP server (see :func:`tool`)."""

    server: str
    remote_name: str
    hint_pending: bool
    hinted_read_only: bool = False
    """What the trusted server's ``readOnlyHint`` said, read when the worker started. It
    decides how this worker's attempts run, never the workflow's path (a declaration): the
    workflow code of a ``read_only=None`` tool is a write's on every worker, whatever each
    worker's server said, so replays never depend on it. (Runs recorded before that, when
    the hint chose the workflow's read path too, replay as recorded: see
    ``READ_PATH_BY_DECLARATION``.)"""

    @property
    def attempt_reads(self) -> bool:
        return self.options.read_only or self.hinted_read_only


class McpToolError(Exception):
    """The MCP tool answered ``isError`` without saying that nothing happened."""


def tool(
    server: str,
    name: str,
    *,
    read_only: bool | None = None,
    approval: Any = False,
    reconcile: Any = None,
    provider_idempotent: Any = False,
    tool_name: str | None = None,
    **options: Any,
) -> McpTool:
    """An exactcall tool for the MCP tool ``name`` of the worker's MCP server ``server``.

    Call it from a workflow with its MCP arguments by name: ``await exactcall.call(t,
    text="hi")``. ``read_only=None``: a write, unless the server is trusted
    (``McpServerSpec(trusted=True)``) and its ``readOnlyHint`` says read-only, which the
    worker checks when it starts: its attempts then run as reads (no claim, errors retried,
    never an unknown outcome), while the workflow's code stays a write's (a keyed call is one
    call), so a worker that saw another hint never changes a replay.
    ``provider_idempotent=True`` when the server honours the key in ``_meta``
    ``io.exactcall/idempotency-key``. ``tool_name`` overrides the exactcall (and
    activity) name ``mcp.<server>.<name>``; the other keyword options are
    ``@exactcall.tool``'s (version, heartbeat_timeout, retry_policy, approval_timeout, ...).
    Defining one name twice for the same MCP tool returns the first definition.
    """
    check_server_name(server)
    if not isinstance(name, str) or not name:
        raise ValueError("exactcall.mcp.tool(server, name): name is the MCP tool's name")
    full = tool_name or f"mcp.{server}.{name}"
    existing = _REGISTRY.get(full)
    if isinstance(existing, McpTool):
        if (existing.server, existing.remote_name) == (server, name):
            return existing  # a module imported again (e.g. in the workflow sandbox)
        raise ValueError(
            f"two exactcall tools are named {full!r}: MCP tool {existing.remote_name!r} of "
            f"server {existing.server!r} and {name!r} of {server!r}; give one another "
            "tool_name= (tool names are activity names)"
        )
    fn = _remote_call(server, name, full)
    opts = {
        "name": full,
        "read_only": bool(read_only),
        "approval": approval,
        "reconcile": reconcile,
        "provider_idempotent": provider_idempotent,
        **options,
    }
    t = McpTool(fn, _options(fn, opts))
    t.server, t.remote_name, t.hint_pending = server, name, read_only is None
    t.reads_by_hint = read_only is None
    _register(t)
    return t


def _remote_call(server: str, remote: str, full: str) -> Any:
    async def call_mcp_tool(**arguments: Any) -> Any:
        intent = current_intent()
        result = await call_tool(server, remote, arguments, meta={KEY_META: intent.key})
        return result_value(remote, result)

    call_mcp_tool.__name__ = call_mcp_tool.__qualname__ = f"mcp_tool[{full}]"
    call_mcp_tool.__doc__ = f"MCP tool {remote!r} of server {server!r}"
    return call_mcp_tool


def result_value(name: str, result: CallToolResult) -> Any:
    """The JSON value of a result; raise NotExecuted or McpToolError for an error result."""
    if result.is_error:
        text = _text(result) or "(no message)"
        meta = result.meta or {}
        if meta.get(NOT_EXECUTED_META) is True:
            raise NotExecuted(f"MCP tool {name} did not run it: {text}")
        raise McpToolError(f"MCP tool {name} answered an error: {text}")
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(c, TextContent) for c in result.content):
        return _text(result)
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def not_executed(message: str) -> CallToolResult:
    """For MCP server authors: an ``isError`` result that says the call did not happen (so an
    exactcall client may retry it)."""
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        is_error=True,
        _meta={NOT_EXECUTED_META: True},
    )


# -- connections -------------------------------------------------------------------------------
_POOL: contextvars.ContextVar[McpPool | None] = contextvars.ContextVar(
    "exactcall_mcp_pool", default=None
)


async def call_tool(
    server: str,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
) -> CallToolResult:
    """Call an MCP tool on this worker's connection ``server``, inside any activity of a worker
    with ``exactcall.Plugin(mcp_servers=...)`` (a reconcile probe, for instance). No exactcall
    protection: the caller decides what an error means."""
    pool = _POOL.get()
    if pool is None:
        raise NotExecuted(
            f"MCP server {server!r}: no MCP connections here; give the worker "
            "exactcall.Plugin(mcp_servers={...}) (or exactcall worker --mcp-server NAME=...), "
            "and call MCP tools only from activities of that worker",
            retry=False,
        )
    return await pool.call(server, name, dict(arguments or {}), meta=dict(meta or {}))


@dataclass(eq=False)
class _Connection:
    """One open MCP client, owned by its own task (anyio scopes must exit where they began)."""

    name: str
    spec: McpServerSpec
    opened: asyncio.Future[Client] = field(init=False)
    tools: dict[str, WireTool] = field(default_factory=dict)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(), name=f"exactcall-mcp-{self.name}")

    async def _own(self) -> None:
        try:
            async with Client(self.spec.target(), cache=None) as client:
                self.tools = await _list_all(client)
                self.opened.set_result(client)
                await self._stop.wait()
        except BaseException as exc:  # reported to the callers waiting on it
            if not self.opened.done():
                self.opened.set_exception(exc)
            else:
                log.warning("mcp.connection_closed", server=self.name, error=repr(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), _CLOSE_TIMEOUT)
            except (Exception, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await self._task


async def _list_all(client: Client) -> dict[str, WireTool]:
    found: dict[str, WireTool] = {}
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        found.update({t.name: t for t in page.tools})
        cursor = page.next_cursor
        if not cursor:
            return found


class McpPool:
    """The MCP servers of one worker: opened on first use, closed when the worker stops."""

    def __init__(self, servers: Mapping[str, Any]) -> None:
        if not isinstance(servers, Mapping) or not servers:
            raise ValueError(
                "exactcall.Plugin(mcp_servers=...) takes a dict: server name -> a command "
                "(list of strings), a streamable HTTP URL, or exactcall.mcp.McpServerSpec"
            )
        self.specs = {check_server_name(n): server_spec(v) for n, v in servers.items()}
        self._open: dict[str, _Connection] = {}
        self._users = 0

    def interceptor(self) -> Interceptor:
        """The worker interceptor that lets this worker's activities reach the pool."""
        return _PoolInterceptor(self)

    async def connection(self, server: str) -> _Connection:
        spec = self.specs.get(server)
        if spec is None:
            known = ", ".join(sorted(self.specs))
            raise NotExecuted(
                f"MCP server {server!r} is not configured on this worker (it has: {known}); "
                f"add it to exactcall.Plugin(mcp_servers={{{server!r}: ...}}) or pass "
                f"--mcp-server {server}=COMMAND",
                retry=False,
            )
        conn = self._open.get(server)
        if conn is None:
            conn = self._open[server] = _Connection(server, spec)
            conn.start()
        try:
            await asyncio.wait_for(asyncio.shield(conn.opened), OPEN_TIMEOUT)
        except Exception as exc:
            await self._drop(server, conn)
            why = "no answer" if isinstance(exc, TimeoutError) else repr(exc)
            raise NotExecuted(
                f"could not connect to MCP server {server!r} ({spec.describe()}): {why}"
            ) from exc
        return conn

    async def call(
        self, server: str, name: str, arguments: dict[str, Any], *, meta: dict[str, Any]
    ) -> CallToolResult:
        conn = await self.connection(server)
        client = conn.opened.result()
        if name not in conn.tools:
            conn.tools = await _list_all(client)
        if name not in conn.tools:
            raise NotExecuted(
                f"MCP server {server!r} has no tool {name!r} (it has: "
                f"{', '.join(sorted(conn.tools)) or 'none'})",
                retry=False,
            )
        _check_required(server, conn.tools[name], arguments)
        try:
            # the SDK types _meta as its own TypedDict; ours is the same mapping
            return await client.call_tool(name, arguments, meta=cast(Any, meta or None))
        except MCPError as exc:
            if exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                raise NotExecuted(
                    f"MCP server {server!r} refused {name}: {exc.message}", retry=False
                ) from exc
            raise McpToolError(f"MCP server {server!r}, tool {name}: {exc.message}") from exc
        except Exception:
            await self._drop(server, conn)  # the connection is in doubt: reopen next time
            raise

    async def _drop(self, server: str, conn: _Connection) -> None:
        if self._open.get(server) is conn:
            del self._open[server]
        await conn.close()

    @contextlib.asynccontextmanager
    async def running(self, tools: Sequence[Tool] = ()) -> AsyncIterator[McpPool]:
        """Held while a worker runs: resolves trusted hints at start, closes at the end."""
        self._users += 1
        try:
            await self.resolve_hints(tools)
            yield self
        finally:
            self._users -= 1
            if self._users == 0:
                await self.aclose()

    async def aclose(self) -> None:
        conns, self._open = list(self._open.values()), {}
        await asyncio.gather(*(c.close() for c in conns))

    async def resolve_hints(self, tools: Sequence[Tool]) -> None:
        """``read_only=None`` tools of trusted servers take their ``readOnlyHint``."""
        for t in tools:
            if not isinstance(t, McpTool) or not t.hint_pending or t.server not in self.specs:
                continue
            if not self.specs[t.server].trusted:
                continue  # an untrusted server's hint decides nothing: the tool stays a write
            try:
                conn = await self.connection(t.server)
            except NotExecuted as exc:
                log.warning("mcp.hints_unavailable", server=t.server, error=exc.message)
                continue
            wire = conn.tools.get(t.remote_name)
            hint = bool(wire and wire.annotations and wire.annotations.read_only_hint)
            # a tool that needs approval is a write, whatever the hint says
            t.hinted_read_only = hint and not t.options.approval
            t.hint_pending = False
            log.info("mcp.read_only_hint", tool=t.name, read_only=hint, server=t.server)


def _check_required(server: str, wire: WireTool, arguments: Mapping[str, Any]) -> None:
    schema = wire.input_schema if isinstance(wire.input_schema, Mapping) else {}
    missing = [r for r in schema.get("required", ()) if r not in arguments]
    if missing:
        raise NotExecuted(
            f"MCP tool {wire.name} of server {server!r} needs the arguments {missing} "
            f"(its input schema requires {list(schema.get('required', ()))}); nothing was sent",
            retry=False,
        )


class _PoolInterceptor(Interceptor):
    def __init__(self, pool: McpPool) -> None:
        self.pool = pool

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _PoolInbound(next, self.pool)


class _PoolInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, pool: McpPool) -> None:
        super().__init__(next)
        self.pool = pool

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        token = _POOL.set(self.pool)
        try:
            return await self.next.execute_activity(input)
        finally:
            _POOL.reset(token)
