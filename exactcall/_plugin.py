"""``exactcall.Plugin``: one object that wires exactcall into a Temporal Client and Worker."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import structlog
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client, ClientConfig
from temporalio.contrib.pydantic import (
    PydanticJSONPlainPayloadConverter,
    PydanticPayloadConverter,
)
from temporalio.converter import CompositePayloadConverter, DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import (
    Interceptor,
    ReplayerConfig,
    WorkerConfig,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from exactcall._converter import ModelsAsPydantic, models_as_pydantic
from exactcall._errors import ExactcallError
from exactcall._tool import Tool, registered_tools, same_names
from exactcall.activities import (
    await_settled,
    budget_charge,
    mark_record,
    probe_activity,
    tool_activity,
)
from exactcall.approvals._binding import (
    PENDING_ATTRIBUTE,
    ed25519_verifier,
    unsigned_identity_warnings,
)
from exactcall.budgets._worker import ledger_worker
from exactcall.reconciliation._verdicts import UNRESOLVED_ATTRIBUTE
from exactcall.workflows import BudgetLedger, CallRecord, Reconcile, UndoRun
from exactcall.workflows._state import WorkflowConfig, inbound_class

__all__ = [
    "SEARCH_ATTRIBUTES",
    "Plugin",
    "carries_pydantic",
    "choose_data_converter",
    "ensure_search_attributes",
]

log = structlog.get_logger("exactcall")

SEARCH_ATTRIBUTES = (PENDING_ATTRIBUTE, UNRESOLVED_ATTRIBUTE)
TEMPORAL_STICKY_TIMEOUT = timedelta(seconds=10)  # temporalio.worker.Worker's default
STICKY_TIMEOUT = timedelta(seconds=1)

# Modules passed through the workflow sandbox, and why:
_PASSTHROUGH = (
    "exactcall",  # one tool registry and one set of error classes for the whole worker
    "structlog",  # imported by exactcall modules; workflows log through workflow.logger only
    "rfc8785",  # pure canonical-JSON encoder, no state
    "cryptography",  # Ed25519 verification of signed approvals (C extension, pure function)
)


class _Interceptor(Interceptor):
    def __init__(self, config: WorkflowConfig) -> None:
        self._inbound = inbound_class(config)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return self._inbound


class Plugin(SimplePlugin):
    """Registers exactcall on a Client (recommended) or a Worker.

    * the tool activities: ``tools`` or, when None, every ``@exactcall.tool`` defined in the
      process when the worker is built; on every worker that polls activity tasks (not on
      one built with ``no_remote_activities=True``, the workflow side of split workers);
    * exactcall's own workflows (the call record, the reconciliation): on a worker that runs
      workflows, never on an activity-only worker;
    * nothing of the two, nor the settings below that touch the worker, when the process
      defines no exactcall tool; a workflow gets exactcall's signal, query and state only at
      its first exactcall call;
    * a data converter that carries pydantic models (intents and records are frozen pydantic
      models): the pydantic one in place of Temporal's default, or, as it is, any converter
      that already carries them (Pydantic AI's, the OpenAI Agents SDK's). When a plugin listed
      after this one insists on replacing the default converter itself (``OpenAIAgentsPlugin``),
      the default is left for it. A converter that cannot carry pydantic models is refused
      with an error, never replaced;
    * the sandbox passthroughs, the workflow interceptor that keeps ordinals, and
      ``ExactcallError`` as a workflow failure type (an unhandled AmbiguousOutcome fails the
      workflow instead of retrying its task forever).
    """

    def __init__(
        self,
        tools: Sequence[Tool] | None = None,
        *,
        approver_keys: Mapping[str, Any] | None = None,
        search_attributes: bool = True,
        mcp_servers: Mapping[str, Any] | None = None,
        run_claims: bool = True,
        fail_stop: bool = True,
    ) -> None:
        """``approver_keys``: approver name -> Ed25519 public key (PEM, raw bytes or key
        object); when given, only decisions signed by those keys are accepted.
        ``search_attributes``: mirror pending approvals and parked calls into the Bool search
        attributes ``ExactcallPending`` and ``ExactcallUnresolved`` (for ``exactcall approvals
        list`` and ``exactcall unresolved``); the worker registers them if the cluster lets it.
        Keep both settings the same on every worker and replayer.
        ``mcp_servers``: server name -> a stdio command (list of strings), a streamable HTTP
        URL or an ``exactcall.mcp.McpServerSpec``, for ``exactcall.mcp.tool`` tools; the
        worker opens each on first use and closes it when it stops (needs the ``mcp``
        extra).
        ``run_claims``: prove once per workflow run that no earlier run of its workflow id
        made calls (one claim record per workflow id), so the run's calls need no per-call
        record; False claims every call with a per-call record, as exactcall 0.1 did (see
        docs/upgrading.md, To one claim per run).
        ``fail_stop``: a worker whose attempt lost its claim to run (its heartbeats not
        acknowledged for about a heartbeat timeout: cut off from the server, or frozen) while
        that attempt's sync tool still runs stops its own process (``os._exit``), so that the
        tool cannot make its effect after another attempt took the call over (docs/
        production.md). False lets such a tool run on."""
        self._run_claims = run_claims
        self._fail_stop = fail_stop
        self._tools = list(tools) if tools is not None else None
        clash = same_names(self._tools or [])
        if clash:
            raise ValueError(
                f"exactcall.Plugin(tools=[...]) lists two tools of one name: {_named(clash)}. "
                "One worker runs one tool per name (it is the activity name): give each app's "
                "worker its own Plugin(tools=[...])"
            )
        self._mcp = _mcp_pool(mcp_servers) if mcp_servers else None
        config = WorkflowConfig(
            verifier=ed25519_verifier(approver_keys) if approver_keys else None,
            search_attributes=search_attributes,
            tools=tuple(self._tools) if self._tools is not None else None,
        )
        self.workflow_config = config
        self._worker_client: Client | None = None
        self._parts = _Parts(tools=True, workflows=True)  # a Replayer: every workflow
        super().__init__(
            "exactcall.Plugin",
            data_converter=None,  # chosen in configure_client, which sees the later plugins
            interceptors=[_Interceptor(config), *_mcp_interceptors(self._mcp)],
            activities=self._activities,
            workflows=self._workflows,
            workflow_runner=_workflow_runner,
            workflow_failure_exception_types=[ExactcallError],
            run_context=self._run_context,
        )

    @property
    def tools(self) -> list[Tool]:
        return self._tools if self._tools is not None else registered_tools()

    def _activities(
        self, existing: Sequence[Callable[..., Any]] | None
    ) -> list[Callable[..., Any]]:
        parts, tools = self._parts, self.tools
        out = list(existing or [])
        if parts.tools:
            out += [
                tool_activity(t, run_claims=self._run_claims, fail_stop=self._fail_stop)
                for t in tools
            ]
            out += [probe_activity(t) for t in tools if t.options.reconcile is not None]
            out.append(await_settled)
        if parts.workflows:
            out.append(mark_record)  # the reconciliation's local activity
            out.append(budget_charge)  # a budgeted call's local activity
        return out

    def _workflows(self, existing: Sequence[type] | None) -> list[type]:
        own = [CallRecord, Reconcile, BudgetLedger, UndoRun] if self._parts.workflows else []
        return [*(existing or []), *own]

    @contextlib.asynccontextmanager
    async def _run_context(self) -> AsyncIterator[None]:
        client = self._worker_client
        if client is not None and self.workflow_config.search_attributes:
            await ensure_search_attributes(client)
        if client is not None:
            signed = self.workflow_config.verifier is not None
            for warning in unsigned_identity_warnings(self.tools, signed):
                log.warning("approvals.unsigned_identities", warning=warning)
        async with contextlib.AsyncExitStack() as stack:
            if client is not None and self._parts.workflows and self._budgeted():
                # ledgers run on a queue of their own, polled beside every budgeted worker
                await stack.enter_async_context(ledger_worker(client))
            if self._mcp is not None:
                await stack.enter_async_context(
                    self._mcp.running(self.tools if client is not None else ())
                )
            yield

    def _budgeted(self) -> bool:
        return any(t.options.budgets for t in self.tools)

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        plugins = list(config.get("plugins") or [])
        later = plugins[plugins.index(self) + 1 :] if self in plugins else []
        config["data_converter"] = choose_data_converter(config.get("data_converter"), later)
        return super().configure_client(config)

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        # a Replayer does not show its plugin list: put a converter-owning plugin (such as
        # OpenAIAgentsPlugin) before exactcall.Plugin() on a Replayer
        config["data_converter"] = choose_data_converter(config.get("data_converter"), [])
        self._parts = _Parts(tools=True, workflows=True)
        return super().configure_replayer(config)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        clash = same_names(self.tools)
        if clash:
            raise ExactcallError(
                f"this process defines two exactcall tools of one name: {_named(clash)}. "
                "exactcall.Plugin() would put both on this worker (a tool's name is its "
                "activity name): list this worker's tools with exactcall.Plugin(tools=[...])"
            )
        self._parts = _parts_for(config, bool(self.tools))
        if not (self._parts.tools or self._parts.workflows):
            return super().configure_worker(config)  # interceptor only: it adds nothing
        client = config.get("client")
        self._worker_client = client
        if client is not None and not carries_pydantic(client.data_converter):
            raise ExactcallError(
                "the worker's client has a data converter that cannot carry pydantic models "
                f"({client.data_converter.payload_converter_class.__name__}): put "
                "exactcall.Plugin() on Client.connect(plugins=[...]) rather than on the Worker"
            )
        budgeted = sorted(t.name for t in self.tools if t.options.budgets)
        if self._parts.workflows and budgeted and config.get("max_cached_workflows") == 0:
            raise ExactcallError(
                f"tools with budgets= ({', '.join(budgeted)}) need a workflow cache on the "
                "worker that runs their workflows: a call reserves through a local activity, "
                "which Temporal cancels and re-runs without end when max_cached_workflows=0. "
                "Leave max_cached_workflows at its default (or any value above 0)"
            )
        if config.get("sticky_queue_schedule_to_start_timeout") == TEMPORAL_STICKY_TIMEOUT:
            # a workflow cached by a worker that died waits this long on its sticky queue
            # before another worker takes its next task: Temporal's 10 s would hold every
            # crashed call that long; a value the user chose is kept
            config["sticky_queue_schedule_to_start_timeout"] = STICKY_TIMEOUT
        return super().configure_worker(config)


def _named(clash: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{n!r} ({' and '.join(origins)})" for n, origins in clash.items())


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What exactcall adds to one worker."""

    tools: bool = False
    """The tool activities (and probes): on a worker that polls activity tasks (a
    workflow-only worker too: tools run on the workflow's own task queue by default); not on
    one built with ``no_remote_activities=True``, Temporal's flag for a worker whose
    activities run elsewhere (the workflow side of split workers)."""
    workflows: bool = False
    """exactcall's workflows (the call record, the reconciliation, its local activity): on a
    worker that runs workflows; an activity-only worker never starts polling workflow tasks."""


def _parts_for(config: WorkerConfig, has_tools: bool) -> _Parts:
    """Nothing for a process that defines no exactcall tool: its workflows cannot call one."""
    if not has_tools:
        return _Parts()
    return _Parts(
        tools=not config.get("no_remote_activities"), workflows=bool(config.get("workflows"))
    )


def _mcp_pool(servers: Mapping[str, Any]) -> Any:
    """The worker's MCP connections (imports the ``mcp`` extra only when MCP is used)."""
    try:
        from exactcall.mcp._tool import McpPool
    except ImportError as exc:
        raise ExactcallError(
            f"exactcall.Plugin(mcp_servers=...) needs the MCP SDK ({exc}): "
            "pip install 'exactcall[mcp]'"
        ) from exc
    return McpPool(servers)


def _mcp_interceptors(pool: Any) -> list[Interceptor]:
    return [] if pool is None else [pool.interceptor()]


async def ensure_search_attributes(client: Client) -> None:
    """Register exactcall's search attributes if the cluster lacks them."""
    ns = client.namespace
    try:
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=ns)
        )
    except RPCError as exc:  # e.g. Temporal Cloud: registered through its own console/API
        log.warning("worker.search_attributes_unchecked", error=str(exc))
        return
    missing = [n for n in SEARCH_ATTRIBUTES if n not in resp.custom_attributes]
    if not missing:
        return
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=ns,
                search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_BOOL for n in missing},
            )
        )
    except RPCError as exc:
        how = "; ".join(
            f"temporal operator search-attribute create --namespace {ns} --name {n} --type Bool"
            for n in missing
        )
        raise ExactcallError(
            f"search attributes {missing} are not registered in namespace {ns!r} and could not "
            f"be added ({exc}). Register them: {how} (or pass "
            "exactcall.Plugin(search_attributes=False) on every worker)"
        ) from exc
    log.info("worker.search_attributes_registered", names=missing, namespace=ns)


def carries_pydantic(conv: DataConverter) -> bool:
    """Whether a data converter carries exactcall's pydantic models: exactcall's wrapper (see
    ``exactcall._converter``), or a converter whose JSON encoding is pydantic's
    (PydanticPayloadConverter, Pydantic AI's subclass of it, the OpenAI Agents SDK's
    composite converter)."""
    cls = conv.payload_converter_class
    if issubclass(cls, PydanticPayloadConverter | ModelsAsPydantic):
        return True
    if not issubclass(cls, CompositePayloadConverter):
        return False
    try:
        payload = cls()  # the DataConverter's own instance is wrapped by Temporal
    except TypeError:  # a composite that needs arguments: not one exactcall can inspect
        return False
    return any(
        isinstance(c, PydanticJSONPlainPayloadConverter) for c in payload.converters.values()
    )


def choose_data_converter(
    existing: DataConverter | None, later_plugins: Sequence[Any] = ()
) -> DataConverter:
    """The data converter exactcall runs with, given the current one and the plugins that will
    configure the client after exactcall. A converter that carries pydantic models is kept as
    it is; any other is wrapped so that exactcall's models are pydantic JSON and every other
    value is the converter's own (the same bytes as without exactcall). The codec and failure
    converter are kept."""
    if existing is not None and carries_pydantic(existing):
        return existing
    if existing is None:
        existing = DataConverter.default
    default = DataConverter.default.payload_converter_class
    if existing.payload_converter_class is default and any(
        _replaces_the_default(p) for p in later_plugins
    ):
        return existing  # that plugin replaces the default with its own (pydantic) converter
    wrapped = models_as_pydantic(existing.payload_converter_class)
    return dataclasses.replace(existing, payload_converter_class=wrapped)


def _replaces_the_default(plugin: Any) -> bool:
    """A later plugin that puts its own pydantic-carrying converter in place of Temporal's
    default (OpenAIAgentsPlugin insists on it; PydanticAIPlugin warns about any other)."""
    chooser = getattr(plugin, "data_converter", None) if isinstance(plugin, SimplePlugin) else None
    if not callable(chooser):
        return False
    try:
        theirs = chooser(DataConverter.default)
    except Exception:
        return False  # it refuses the default too: its own error will say why
    return (
        isinstance(theirs, DataConverter)
        and theirs.payload_converter_class is not DataConverter.default.payload_converter_class
        and carries_pydantic(theirs)
    )


def _workflow_runner(existing: WorkflowRunner | None) -> WorkflowRunner:
    if isinstance(existing, SandboxedWorkflowRunner):
        return dataclasses.replace(
            existing, restrictions=existing.restrictions.with_passthrough_modules(*_PASSTHROUGH)
        )
    if existing is None:
        return SandboxedWorkflowRunner(
            restrictions=SandboxedWorkflowRunner().restrictions.with_passthrough_modules(
                *_PASSTHROUGH
            )
        )
    return existing
