"""Seeing and settling a proxied write with no proxy running (``exactcall unresolved`` and
``exactcall resolve``).

A proxy killed mid-write leaves the call unknown, parked for a person. Two things used to need
a proxy of that name running: the embedded server (it stops with the last proxy, and the address
the proxy printed goes stale) and the worker that applies the verdict (the call's workflows run
on the proxy's task queue). Here the CLI does both for itself:

* :func:`embedded_for_cli`: with no Temporal configured (or given the embedded server's old
  address, which no longer answers) and an embedded database in the state folder
  (``$EXACTCALL_HOME/mcp/temporal.db``, or ``--home``), the command shares that server, or
  starts it on that database for as long as it runs, as a proxy would;
* :func:`driving_proxies`: while the command runs, a worker on the task queue of each proxy
  with a call open runs their workflow tasks (and takes no activity task), so a killed proxy's
  call becomes unknown and is listed, and a verdict is applied and confirmed at once.
  ``--landed`` and ``--abandon`` settle the call there; a retry through a proxy gets that
  outcome later. ``--not-landed`` sends the call once more, and only a proxy of that name can
  send it: the next one to start does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client

from exactcall._plugin import Plugin
from exactcall._wire import RECONCILE_WORKFLOW, UNRESOLVED_ATTRIBUTE
from exactcall._worker import Connection, build_worker, connect
from exactcall.embedded._server import port_open
from exactcall.embedded._shared import (
    Embedded,
    embedded_paths,
    is_configured,
    start_embedded,
)
from exactcall.embedded._shared import host_port as _host_port
from exactcall.embedded._shared import read_info as _read_info
from exactcall.mcp._proxy_workflow import (
    MCP_PROXY_APPROVED_WORKFLOW,
    MCP_PROXY_OWNED_WORKFLOW,
    MCP_PROXY_WORKFLOW,
    ApprovedProxyCall,
    OwnedProxyCall,
    ProxyCall,
    proxy_tool,
)
from exactcall.mcp._proxy_workflow import (
    MCP_PROXY_OWNER_REPORT_SIGNAL as REPORTED,
)
from exactcall.reconciliation import list_unresolved

__all__ = ["driving_proxies", "embedded_for_cli", "use_home"]

DEFAULT_ADDRESS = "localhost:7233"


def use_home(home: Path | None) -> None:
    """``--home DIR``: this process's state folder (as ``EXACTCALL_HOME=DIR``)."""
    if home is not None:
        os.environ["EXACTCALL_HOME"] = str(Path(home).expanduser().resolve())


def _wanted(conn: Connection, home_given: bool) -> bool:
    """Whether the command's calls are on the embedded server rather than where ``conn``
    points: nothing else is configured (and nothing answers on localhost:7233, unless the
    state folder was named), or ``conn`` is the embedded server's address, no longer
    answering (a command a proxy printed before the server stopped)."""
    paths = embedded_paths()
    if not paths["db"].exists():
        return False
    if conn.address:
        info = _read_info(paths["json"]) or {}
        return conn.address == info.get("address") and not port_open(*_host_port(conn.address))
    if is_configured(conn):
        return False
    return home_given or not port_open(*_host_port(DEFAULT_ADDRESS))


async def embedded_for_cli(
    conn: Connection, home: Path | None, command: str
) -> tuple[Connection, Embedded | None]:
    """The connection to use, and the embedded server share to leave when done (None: not
    the embedded server)."""
    use_home(home)
    if not _wanted(conn, home is not None):
        return conn, None
    embedded = await asyncio.to_thread(start_embedded)
    started = "started it" if embedded.server is not None else "it was running"
    print(
        f"exactcall {command}: the MCP proxies' embedded server ({embedded_paths()['db']}; "
        f"{started}) at {embedded.address}",
        file=sys.stderr,
    )
    return Connection(address=embedded.address, namespace=conn.namespace), embedded


PROXY_TYPES = (MCP_PROXY_WORKFLOW, MCP_PROXY_APPROVED_WORKFLOW, MCP_PROXY_OWNED_WORKFLOW)
QUIET = timedelta(seconds=1.5)
"""An owned call's proxy sends a keepalive every second while it lives."""
CATCH_UP = 15.0
"""How long a command waits for the proxies' workflows to act on what came while no proxy
ran (a killed proxy's call becoming unknown, a verdict being applied)."""


@contextlib.asynccontextmanager
async def driving_proxies(conn: Connection, client: Client) -> AsyncIterator[None]:
    """While the command runs: a worker on the task queue of each proxy with a call still
    open, taking workflow tasks only (the calls themselves are sent by proxies, never from
    here), so what needs a proxy's worker happens with none running: a killed proxy's call
    becomes unknown and is listed, a verdict is applied and confirmed."""
    types = " OR ".join(f"WorkflowType = '{t}'" for t in PROXY_TYPES)
    running = f"({types}) AND ExecutionStatus = 'Running'"
    queues = sorted({wf.task_queue async for wf in client.list_workflows(running)})
    if not queues:
        yield
        return
    own = await connect(conn, Plugin(tools=[proxy_tool]))
    async with contextlib.AsyncExitStack() as stack:
        for queue in queues:
            worker = build_worker(
                own,
                queue,
                [ProxyCall, ApprovedProxyCall, OwnedProxyCall],
                no_remote_activities=True,
                max_cached_workflows=0,
            )
            await stack.enter_async_context(worker)
        await _caught_up(client, queues)
        yield
        await _caught_up(client, queues)  # what the command started (a verdict) ends here


async def _caught_up(client: Client, queues: list[str]) -> None:
    """Until no open workflow on ``queues`` has a task waiting (bounded), then until every
    unresolved reconciliation among them is in the listing (visibility lags a little)."""
    on = " OR ".join(f"TaskQueue = '{q}'" for q in queues)
    deadline = time.monotonic() + CATCH_UP
    parked: set[str] = set()
    while time.monotonic() < deadline:
        busy, parked = False, set()
        async for wf in client.list_workflows(f"({on}) AND ExecutionStatus = 'Running'"):
            handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
            desc = await handle.describe()
            busy = busy or desc.raw_description.HasField("pending_workflow_task")
            if wf.workflow_type == RECONCILE_WORKFLOW and _unresolved(desc):
                parked.add(wf.id)
            elif wf.workflow_type == MCP_PROXY_OWNED_WORKFLOW and not busy:
                busy = await _owner_gone_quiet(handle)
        if not busy:
            break
        await asyncio.sleep(0.2)
    while parked and time.monotonic() < deadline:
        listed = {r.reconcile_id for r in await list_unresolved(client)}
        if parked <= listed:
            return
        await asyncio.sleep(0.2)


async def _owner_gone_quiet(handle: Any) -> bool:
    """An owned call with no report and no reconciliation yet, whose proxy has sent nothing
    for a while: it went away, and the run is about to find the outcome unknown."""
    last = None  # when the run was created, or its proxy last said something
    async for ev in handle.fetch_history_events():
        if ev.HasField("start_child_workflow_execution_initiated_event_attributes"):
            return False  # its reconciliation runs
        said = ev.HasField("workflow_execution_signaled_event_attributes")
        if said and ev.workflow_execution_signaled_event_attributes.signal_name == REPORTED:
            return False
        if said or ev.HasField("workflow_execution_started_event_attributes"):
            last = ev.event_time.ToDatetime(tzinfo=UTC)
    return last is not None and datetime.now(UTC) - last > QUIET


def _unresolved(desc: Any) -> bool:
    attrs = desc.typed_search_attributes
    return any(p.key.name == UNRESOLVED_ATTRIBUTE and p.value is True for p in attrs)
