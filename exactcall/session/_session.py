"""``exactcall.session``: guarded calls from code that is not a workflow.

A session holds, for as long as it is open: a Temporal client (the one given, the configured
cluster, or the user's embedded server), a worker in this process on the session's task queue
(exactcall's workflows, the session's call workflow, every registered tool), and the session's
lock (one live process at a time, see :mod:`._lock`). Each call is the workflow
``session_call_id(session, step)``; see :mod:`._workflow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.worker import Worker

from exactcall._canonical import args_hash
from exactcall._errors import AmbiguousOutcome, ExactcallError, InvalidCall
from exactcall._plugin import Plugin
from exactcall._tool import Tool, resolve_tool
from exactcall._wire import (
    SESSION_LOCK_ACQUIRE_UPDATE,
    SESSION_LOCK_RELEASE_UPDATE,
    session_call_id,
    session_id_prefix,
)
from exactcall._worker import Connection, build_worker, connect
from exactcall.embedded._shared import Embedded, cli_flags, is_configured, start_embedded
from exactcall.reconciliation._verdicts import Settled
from exactcall.session._calls import (
    check_plugin,
    input_of,
    intent_of_call,
    may_wait_for_a_person,
    not_in_workflow,
    typed,
)
from exactcall.session._errors import ApprovalPending, SessionBusy, rebuilt
from exactcall.session._lock import BEAT, Holder, SessionLock, hold, on_hold_lost
from exactcall.session._workflow import CallInput, Outcome, SessionCall
from exactcall.workflows._call import _check_key, intent_conflict
from exactcall.workflows._unknown import settled_result

__all__ = ["MAX_SESSION_ID", "Session", "session"]

MAX_SESSION_ID = 200
OnUnknown = Literal["wait", "raise"]
_OPEN: set[str] = set()
"""Sessions open in this process (a second open of one is refused at once)."""
STICKY = timedelta(seconds=2)
"""How long a killed process's sticky queue holds its workflows' next tasks."""
PENDING_POLL = 0.2
"""How often ``wait=False`` asks whether the call waits for a person (seconds)."""


def session(id: str, *, client: Client | None = None, task_queue: str | None = None) -> Session:
    """``async with exactcall.session("order-42") as s: await s.call(pay, 10, "alice")``.

    ``id`` plays the workflow id's part: the same id and the same step (``pay#1``, or
    ``key=``) are the same call, whichever process makes it. ``client``: a Temporal client
    with ``exactcall.Plugin()`` (default: the configured Temporal, else the embedded server).
    ``task_queue``: where this process's worker runs the session's calls (default
    ``exactcall-session-<id>``).
    """
    return Session(id, client=client, task_queue=task_queue)


class Session:
    """An open session: ``call`` runs a tool once at its step (see :func:`session`)."""

    def __init__(
        self, id: str, *, client: Client | None = None, task_queue: str | None = None
    ) -> None:
        if not isinstance(id, str) or not id.strip() or len(id) > MAX_SESSION_ID:
            raise InvalidCall(
                f"session id {id!r}: a session id is a non-empty string of at most "
                f"{MAX_SESSION_ID} characters (it plays a workflow id's part)"
            )
        self.id = id
        self.task_queue = task_queue or session_id_prefix(id)
        self._given = client
        self._client: Client | None = None
        self._embedded: Embedded | None = None
        self._ordinals: dict[str, int] = {}
        self._owner = uuid.uuid4().hex
        self._workers: list[tuple[Worker, asyncio.Task[None]]] = []
        self._lost: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- opening and closing --------------------------------------------------------------
    async def __aenter__(self) -> Session:
        not_in_workflow("exactcall.session")
        self._loop = asyncio.get_running_loop()
        if self.id in _OPEN:
            raise SessionBusy(
                f"exactcall.session({self.id!r}) is already open in this process: one at a "
                "time; use the session object that is open",
                session=self.id,
            )
        _OPEN.add(self.id)
        try:
            self._client = self._given or await self._connect()
            check_plugin(self._client)
            self._start_lock_workers(self._client)
            await self._acquire(self._client)
            self._run_workers(  # only now: a process refused the session runs none of its calls
                build_worker(self._client, self.task_queue, [SessionCall], sticky_timeout=STICKY)
            )
        except BaseException:
            await self._close(release=False)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._close(release=True)

    @property
    def client(self) -> Client:
        if self._client is None:
            raise ExactcallError("the session is not open: use `async with exactcall.session(...)`")
        return self._client

    @property
    def address(self) -> str | None:
        """The embedded server's address, when the session uses it."""
        return self._embedded.address if self._embedded is not None else None

    async def _connect(self) -> Client:
        conn = Connection()
        if not is_configured(conn):
            self._embedded = await asyncio.to_thread(start_embedded)
            conn = Connection(address=self._embedded.address)
        return await connect(conn, Plugin())

    def _start_lock_workers(self, client: Client) -> None:
        """The lock's workflow (its own queue, served by every process that opens or holds
        the session) and this process's hold (its own queue), on a client without plugins:
        nothing of exactcall's or of the tools' is registered there."""
        bare = Client(
            client.service_client, namespace=client.namespace, data_converter=client.data_converter
        )
        self._run_workers(
            Worker(
                bare,
                task_queue=self._lock_queue,
                workflows=[SessionLock],
                sticky_queue_schedule_to_start_timeout=STICKY,
            ),
            Worker(
                bare,
                task_queue=self._own_queue,
                activities=[hold],
                max_heartbeat_throttle_interval=timedelta(seconds=BEAT),
                graceful_shutdown_timeout=timedelta(seconds=1),
            ),
        )

    def _run_workers(self, *workers: Worker) -> None:
        for w in workers:
            task = asyncio.create_task(w.run(), name=f"exactcall-{w.task_queue}")
            self._workers.append((w, task))

    @property
    def _lock_queue(self) -> str:
        return f"{self.task_queue}/lock"

    @property
    def _own_queue(self) -> str:
        return f"{self.task_queue}/{self._owner}"

    async def _acquire(self, client: Client) -> None:
        me = Holder(
            owner=self._owner,
            task_queue=self._own_queue,
            pid=os.getpid(),
            host=socket.gethostname(),
            since=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        on_hold_lost(self._owner, self._hold_lost)
        for _ in range(20):  # the lock's run may be ending as we ask: ask its next one
            start = WithStartWorkflowOperation(
                SessionLock.run,
                self.id,
                id=session_id_prefix(self.id),
                task_queue=self._lock_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                static_summary=f"exactcall session {self.id}",
            )
            try:
                await client.execute_update_with_start_workflow(
                    SESSION_LOCK_ACQUIRE_UPDATE, me, start_workflow_operation=start
                )
                return
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause
                if isinstance(cause, ApplicationError) and cause.type == SessionBusy.code:
                    raise SessionBusy(
                        f"exactcall.session({self.id!r}): {cause.message}", session=self.id
                    ) from None
                raise
            except Exception as exc:  # the run completed between the start and the update
                if "completed" not in str(exc).lower():
                    raise
                await asyncio.sleep(0.05)
        raise ExactcallError(f"could not open session {self.id!r}: its lock kept closing")

    def _hold_lost(self) -> None:
        self._lost = (
            f"this process lost session {self.id!r}: its lease ran out (no heartbeat for "
            "a while: the process was paused or cut off from Temporal); another process may "
            "hold it now. Open the session again."
        )

    async def _close(self, *, release: bool) -> None:
        _OPEN.discard(self.id)
        on_hold_lost(self._owner, None)
        client = self._client
        if release and client is not None and self._lost is None:
            with contextlib.suppress(Exception):
                handle = client.get_workflow_handle(session_id_prefix(self.id))
                await handle.execute_update(SESSION_LOCK_RELEASE_UPDATE, self._owner)
        for w, task in reversed(self._workers):
            with contextlib.suppress(Exception):
                await w.shutdown()
                await task
        self._workers.clear()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None
        self._client = None

    # -- calls ----------------------------------------------------------------------------
    async def call(
        self,
        tool: Tool | str,
        /,
        *args: Any,
        key: str | None = None,
        wait: bool = True,
        on_unknown: OnUnknown | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``tool(*args, **kwargs)`` once at its step in this session.

        The step is the tool's next ordinal in this process's session (``pay#1``, ``pay#2``)
        or ``key``. A step that already ran gives its recorded outcome (other arguments:
        IntentConflict); one still going on (a call a killed process left, an approval, a
        reconciliation) is waited for. ``wait=False``: raise ApprovalPending when the call
        waits for a person, instead of waiting. A tool with its own ``key``, ``wait`` or
        ``on_unknown`` parameter is called with :meth:`call_with`.
        """
        t = resolve_tool(tool)
        options = {"key": key, "on_unknown": on_unknown, "wait": None if wait else False}
        for name, value in options.items():
            if value is not None and name in t.params:
                raise InvalidCall(
                    f"{t.name} has its own parameter {name!r}, so s.call(..., {name}=...) is "
                    f"ambiguous: use s.call_with(tool, kwargs={{{name!r}: ...}}, {name}=...)",
                    tool=t.name,
                )
        return await self.call_with(
            t, args=args, kwargs=kwargs, key=key, wait=wait, on_unknown=on_unknown
        )

    async def call_with(
        self,
        tool: Tool | str,
        /,
        args: Any = (),
        kwargs: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        wait: bool = True,
        on_unknown: OnUnknown | None = None,
    ) -> Any:
        """Like :meth:`call`, with the tool's arguments passed apart from the options."""
        not_in_workflow("a session call")
        self._check_usable()
        t = resolve_tool(tool)
        if on_unknown not in (None, "wait", "raise"):
            raise InvalidCall(f"on_unknown={on_unknown!r}: use 'wait' or 'raise'", tool=t.name)
        canonical = t.canonical_args(tuple(args), kwargs or {})
        h = args_hash(t.name, canonical)
        step = self._next_step(t.name) if key is None else _check_key(key)
        inp = CallInput(
            session=self.id,
            tool=t.name,
            args=canonical,
            args_hash=h,
            step=step,
            explicit_key=key is not None,
            on_unknown=on_unknown,
        )
        handle = await self._start(t, inp)
        if not wait and may_wait_for_a_person(t):
            await self._until_done_or_pending(t, inp, handle)
        outcome = await self._result(handle)
        if outcome.kind == "done":
            return typed(t, outcome.result)
        rid = outcome.fields.get("reconcile_id")
        waits = (on_unknown or t.options.on_unknown) == "wait"
        if outcome.code == AmbiguousOutcome.code and waits and isinstance(rid, str):
            # recorded by an earlier call that did not wait (on_unknown="raise"): this one
            # waits for the verdict, as a call from a workflow does
            settled = await self.client.get_workflow_handle(rid, result_type=Settled).result()
            return typed(
                t, settled_result(t, intent_of_call(self.client, t, inp, handle.id), settled)
            )
        raise rebuilt(outcome.code, outcome.message, outcome.fields)

    def _next_step(self, tool: str) -> str:
        n = self._ordinals.get(tool, 0) + 1
        self._ordinals[tool] = n
        return f"{tool}#{n}"

    def _check_usable(self) -> None:
        if self._client is None:
            raise ExactcallError(
                f"session {self.id!r} is not open: call inside `async with exactcall.session(...)`"
            )
        if self._lost is not None:
            raise SessionBusy(self._lost, session=self.id)
        if asyncio.get_running_loop() is not self._loop:
            raise ExactcallError(
                "a session's calls run on the event loop that opened it (from other threads "
                "or loops, use exactcall.session_sync)"
            )

    async def _start(self, t: Tool, inp: CallInput) -> WorkflowHandle[Any, Outcome]:
        """The call's workflow: started now, or the one an earlier process started (same
        arguments: attach to it; other arguments: IntentConflict, nothing ran)."""
        wid = session_call_id(self.id, inp.step)
        client = self.client
        try:
            return await client.start_workflow(
                SessionCall.run,
                inp,
                id=wid,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=f"{t.name} {inp.step} of session {self.id}",
            )
        except WorkflowAlreadyStartedError:
            pass
        handle = client.get_workflow_handle(wid, result_type=Outcome)
        recorded = await input_of(client, handle)
        if recorded.args_hash != inp.args_hash:
            raise intent_conflict(
                t, inp, "already ran", recorded.args_hash, f"in session {self.id!r}"
            )
        return handle

    async def _result(self, handle: WorkflowHandle[Any, Outcome]) -> Outcome:
        try:
            return await handle.result()
        except WorkflowFailureError as exc:
            raise ExactcallError(
                f"the call's workflow {handle.id} did not finish ({exc.cause}); see it with "
                f"`temporal workflow show -w '{handle.id}'`",
                workflow_id=handle.id,
            ) from exc

    async def _until_done_or_pending(
        self, t: Tool, inp: CallInput, handle: WorkflowHandle[Any, Outcome]
    ) -> None:
        """Return once the call has ended; raise ApprovalPending once it waits for a person."""
        from exactcall.approvals._client import view

        result = asyncio.ensure_future(handle.result())
        try:
            while not result.done():
                try:
                    pending = (await view(self.client, handle.id)).pending
                except Exception:  # no worker answered yet: ask again
                    pending = []
                for r in pending:
                    if r.step == inp.step:
                        raise self._pending(t, inp, handle.id, r.approvals_needed)
                await asyncio.wait([result], timeout=PENDING_POLL)
        finally:
            result.cancel()

    def _pending(self, t: Tool, inp: CallInput, wid: str, needed: int) -> ApprovalPending:
        address = self._embedded.address if self._embedded else None
        flags = cli_flags(address, self.client.namespace)
        command = f"exactcall approve '{wid}' '{inp.step}' --hash {inp.args_hash}{flags}"
        return ApprovalPending(
            f"{t.name} {inp.step} of session {self.id!r} waits for approval "
            f"({needed} needed); nothing ran. Approve it with: {command}",
            tool=t.name,
            step=inp.step,
            session=self.id,
            workflow_id=wid,
            args_hash=inp.args_hash,
            command=command,
        )
