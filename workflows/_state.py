"""Per-workflow state kept by exactcall's workflow interceptor.

For each workflow run that calls exactcall (made at its first call, kept on the run's
interceptor): the ordinal of each tool (carried over continue-as-new in a header), the calls in
flight by key, and the approval book with its signal and query handlers.
Deterministic workflow code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import is_cancelled_exception
from temporalio.worker import (
    ContinueAsNewInput,
    ExecuteWorkflowInput,
    HandleSignalInput,
    HandleUpdateInput,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowOutboundInterceptor,
)

from exactcall._errors import PluginNotInstalled
from exactcall._model import Intent
from exactcall._tool import TOOL_SCOPE, Tool
from exactcall._wire import CANCEL_PATCH as CANCEL_PATCH
from exactcall._wire import CARRY_HEADER as CARRY_HEADER
from exactcall._wire import READ_HEADER
from exactcall._wire import SEARCH_ATTRIBUTES_OFF_PATCH as SEARCH_ATTRIBUTES_OFF_PATCH
from exactcall._wire import SEARCH_ATTRIBUTES_ON_PATCH as SEARCH_ATTRIBUTES_ON_PATCH
from exactcall.approvals._binding import (
    APPROVALS_QUERY,
    DECIDE_SIGNAL,
    PENDING_ATTRIBUTE,
    PENDING_MEMO,
    ApprovalBook,
    ApprovalsView,
    Decision,
    Verifier,
)

__all__ = [
    "CANCEL_PATCH",
    "CARRY_HEADER",
    "SCHEDULING_A_READ",
    "SEARCH_ATTRIBUTES_OFF_PATCH",
    "SEARCH_ATTRIBUTES_ON_PATCH",
    "FailTheRun",
    "Flight",
    "WorkflowConfig",
    "WorkflowState",
    "current_config",
    "inbound_class",
    "pinned_search_attributes",
    "state",
]

PENDING_KEY = SearchAttributeKey.for_bool(PENDING_ATTRIBUTE)


@dataclass(frozen=True)
class WorkflowConfig:
    """Worker-wide settings the workflow side needs (constant for replay)."""

    verifier: Verifier | None = None
    search_attributes: bool = True
    tools: tuple[Tool, ...] | None = None
    """The worker's tools when its plugin lists them (``Plugin(tools=[...])``): a tool named
    by a string resolves to one of these (see ``exactcall._tool.TOOL_SCOPE``)."""


@dataclass
class Flight:
    """One call in flight, shared by every caller of its key in this workflow.

    It is cancelled when its last waiting caller is cancelled (or the workflow ends
    cancelled), not when one of several callers is. ``interruptible`` is False while the call
    starts its reconciliation or settles after a cancellation: those steps always finish,
    and the flight looks at ``cancelled`` after them.
    """

    intent: Intent
    task: asyncio.Task[Any] = field(init=False)
    waiters: int = 0
    cancelled: bool = False
    interruptible: bool = True

    def start(self, work: Coroutine[Any, Any, Any]) -> Flight:
        self.task = asyncio.ensure_future(work)
        return self

    def cancel(self) -> None:
        if self.cancelled or self.task.done():
            return
        self.cancelled = True
        if self.interruptible:
            self.task.cancel()

    async def finished(self) -> None:
        """Wait until the flight ended, whatever its outcome (never cancels it)."""
        await asyncio.wait([self.task])
        if not self.task.cancelled():
            self.task.exception()  # retrieved: the callers see it, or cancellation wins


@dataclass
class WorkflowState:
    config: WorkflowConfig
    book: ApprovalBook
    ordinals: dict[str, int] = field(default_factory=dict)
    flights: dict[str, Flight] = field(default_factory=dict)
    reads: dict[str, tuple[str, asyncio.Future[Any]]] = field(default_factory=dict)
    """Read-only calls in flight by key: (args hash, the activity), so concurrent reads with
    one explicit key are one activity (its id is derived from the key)."""
    published: bool = False
    settled: dict[str, Any] = field(default_factory=dict)
    """Verdicts that joined reconciliations signalled, by key (see ``_joined`` in _call.py)."""
    calls_of: str | None = None
    """The workflow id whose calls this run makes, when not its own (``exactcall undo``
    makes each undo as a call of the undone run: the key the run's own saga would use)."""
    search_attributes_choice: bool | None = None
    """This run's pinned choice (see SEARCH_ATTRIBUTES_ON_PATCH), once made."""
    budget_spends: list[Any] = field(default_factory=list)
    """Spends of done calls not sent yet (``ChargeOp``s, see BUDGET_SPENDS_CARRIED): the
    run's next reservation carries them, or they are sent when the run's code ends."""
    budget_allowances: list[Any] = field(default_factory=list)
    """Budget this run holds for its next calls (``Allowance``s, see BUDGET_ALLOWANCES)."""
    budget_asks: dict[str, int] = field(default_factory=dict)
    """Reservations this run made on each ledger (by ledger id): what its next one asks."""

    def upserts_search_attributes(self) -> bool:
        """Whether this run upserts exactcall's search attributes (pinned at first use)."""
        if self.search_attributes_choice is None:
            self.search_attributes_choice = _pin_search_attributes(self.config.search_attributes)
        return self.search_attributes_choice

    def next_step(self, tool: str) -> str:
        n = self.ordinals.get(tool, 0) + 1
        self.ordinals[tool] = n
        return f"{tool}#{n}"

    async def cancel_flights(self) -> None:
        """The workflow ends cancelled: cancel every call still in flight, wait for each."""
        left = [f for f in self.flights.values() if not f.task.done()]
        if not left or not cancellation_reaches_calls():
            return
        for f in left:
            f.cancel()
        for f in left:
            await f.finished()

    def publish_pending(self) -> None:
        """Mirror pending approvals into the memo and the search attribute (for listing)."""
        pending = self.book.pending()
        if not pending and not self.published:
            return
        workflow.upsert_memo(
            {PENDING_MEMO: [p.model_dump(mode="json") for p in pending] if pending else None}
        )
        if self.upserts_search_attributes():
            workflow.upsert_search_attributes([PENDING_KEY.value_set(bool(pending))])
        self.published = True


SCHEDULING_A_READ: ContextVar[bool | None] = ContextVar("exactcall_scheduling_a_read", default=None)
"""Set around the scheduling of a call's activity: True for a read, False for a write (its
header then says which); None for any other activity."""
_CURRENT: ContextVar[_Inbound | None] = ContextVar("exactcall_workflow", default=None)
"""The exactcall interceptor of the workflow run whose code is running. Set by the interceptor
in the workflow's main task and in each handler's task (tasks those start inherit it), so the
state lives on the run's interceptor: nothing is added to the workflow object, and a run that
never calls exactcall gets no state, no signal and no query."""


def _pin_search_attributes(flag: bool) -> bool:
    """Record (or, replaying, read back) this run's choice.

    Not replaying: "off" is recorded as a patch marker, "on" is not recorded (no marker means
    on). Replaying, ``patched`` returns True only for a marker that is in the history (and adds
    no command for one that is not), so the recorded choice wins over the replaying worker's
    flag. Not replaying, ``patched`` always records its marker, so it is called only for "off".
    """
    if workflow.unsafe.is_replaying():
        if workflow.patched(SEARCH_ATTRIBUTES_ON_PATCH):  # recorded by exactcall 0.1 workers
            return True
        return not workflow.patched(SEARCH_ATTRIBUTES_OFF_PATCH)
    if flag:
        return True
    workflow.patched(SEARCH_ATTRIBUTES_OFF_PATCH)
    return False


def pinned_search_attributes() -> bool:
    """Whether the current workflow run upserts exactcall's search attributes.

    Use it instead of ``current_config().search_attributes`` before an upsert: the choice is
    pinned in the run's history at the first use (see SEARCH_ATTRIBUTES_ON_PATCH), so it does not
    change when a worker with another ``Plugin(search_attributes=...)`` replays the run."""
    return state().upserts_search_attributes()


def cancellation_reaches_calls() -> bool:
    """Whether a cancellation cancels the calls it reaches (see CANCEL_PATCH)."""
    return workflow.patched(CANCEL_PATCH)


def state() -> WorkflowState:
    """This run's exactcall state, made (with its approval signal and query) at first use."""
    inbound = _CURRENT.get()
    if inbound is None:
        raise PluginNotInstalled(
            "exactcall.call ran on a worker without exactcall.Plugin(): add "
            "plugins=[exactcall.Plugin()] to the Client or the Worker"
        )
    if inbound.state is None:
        inbound.state = _install(inbound.config)
    return inbound.state


def current_config() -> WorkflowConfig:
    return state().config


def _carried_ordinals() -> dict[str, int]:
    payload = workflow.info().headers.get(CARRY_HEADER)
    if payload is None:
        return {}
    return dict(workflow.payload_converter().from_payload(payload, dict[str, int]))


def _install(config: WorkflowConfig) -> WorkflowState:
    info = workflow.info()
    st = WorkflowState(
        config=config,
        book=ApprovalBook(workflow_id=info.workflow_id, verifier=config.verifier),
        ordinals=_carried_ordinals(),
    )

    def on_decide(decision: Decision) -> None:
        rec = st.book.decide(decision, workflow.now())
        log = workflow.logger.info if rec.accepted else workflow.logger.warning
        log(
            "exactcall approval.%s: %s %s step=%s hash=%s by=%s: %s",
            "accepted" if rec.accepted else "rejected",
            decision.decision,
            decision.tool or "",
            decision.step,
            decision.args_hash,
            decision.by,
            rec.outcome,
        )
        st.publish_pending()

    def on_query() -> ApprovalsView:
        return st.book.view()

    workflow.set_signal_handler(DECIDE_SIGNAL, on_decide)
    workflow.set_query_handler(APPROVALS_QUERY, on_query)
    return st


class FailTheRun(BaseException):
    """An exactcall error that must fail the run, carried past a framework that hands every
    ``Exception`` a tool raises to the model (Google GenAI's automatic function calling,
    Strands): the plugin's workflow interceptor raises ``error`` itself where the run's code
    ends (see ``exactcall.adapters``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class _Inbound(WorkflowInboundInterceptor):
    """One per workflow run: holds the run's exactcall state once it has one."""

    config: WorkflowConfig = WorkflowConfig()
    scope: Mapping[str, Tool] | None = None

    def _enter(self) -> None:
        """In the task about to run workflow code (main, signal or update handler)."""
        _CURRENT.set(self)
        if self.scope is not None:
            TOOL_SCOPE.set(self.scope)

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self.state: WorkflowState | None = None
        super().init(_Outbound(outbound, self))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        self._enter()  # in the main task's own context
        try:
            result = await super().execute_workflow(input)
        except FailTheRun as carried:  # an adapter's error the framework would have hidden
            await self._send_spends()
            raise carried.error from None
        except BaseException as err:
            # a workflow that ends cancelled cancels the calls it still has in flight (in
            # tasks of its own, which its cancellation did not reach) and waits for them
            if self.state is not None and is_cancelled_exception(err):
                await self.state.cancel_flights()
            await self._send_spends()
            raise
        await self._send_spends()
        return result

    async def _send_spends(self) -> None:
        """The run's code has ended (returned, failed, continued as new or was cancelled):
        send the spends no later reservation carried, release what its allowances hold."""
        st = self.state
        if st is not None and (st.budget_spends or st.budget_allowances):
            from exactcall.workflows._budget_calls import send_spends  # (imports this module)

            await send_spends(st)

    async def handle_signal(self, input: HandleSignalInput) -> None:
        self._enter()  # a handler runs in a task of its own
        return await super().handle_signal(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        self._enter()
        return await super().handle_update_handler(input)


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, inbound: _Inbound) -> None:
        super().__init__(next)
        self._inbound = inbound

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        read = SCHEDULING_A_READ.get()
        if read is not None:  # a call: the history says whether it was a read
            said: Payload = workflow.payload_converter().to_payload(read)
            input.headers = {**input.headers, READ_HEADER: said}
        return super().start_activity(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        st = self._inbound.state
        if st is not None and st.ordinals:
            carried: Payload = workflow.payload_converter().to_payload(st.ordinals)
            input.headers = {**input.headers, CARRY_HEADER: carried}
        elif CARRY_HEADER in workflow.info().headers:  # a run that made no call passes it on
            input.headers = {**input.headers, CARRY_HEADER: workflow.info().headers[CARRY_HEADER]}
        return super().continue_as_new(input)


def inbound_class(config: WorkflowConfig) -> type[WorkflowInboundInterceptor]:
    scope = None if config.tools is None else {t.name: t for t in config.tools}
    return type("ExactcallWorkflowInbound", (_Inbound,), {"config": config, "scope": scope})
