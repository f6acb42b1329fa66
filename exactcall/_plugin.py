"""``exactcall.Plugin``: one object that wires exactcall into a Temporal Client and Worker."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import structlog
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import (
    Interceptor,
    WorkerConfig,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from exactcall.activities import await_settled, probe_activity, tool_activity
from exactcall.workflows import CallRecord, Reconcile

from ._approval import PENDING_ATTRIBUTE, ed25519_verifier
from ._errors import ExactcallError
from ._reconcile import UNRESOLVED_ATTRIBUTE
from ._tool import Tool, registered_tools
from ._wfstate import WorkflowConfig, inbound_class

__all__ = ["SEARCH_ATTRIBUTES", "Plugin", "ensure_search_attributes"]

log = structlog.get_logger("exactcall")

SEARCH_ATTRIBUTES = (PENDING_ATTRIBUTE, UNRESOLVED_ATTRIBUTE)

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
      process when the worker is built;
    * exactcall's own workflows (the per-key call record);
    * the pydantic data converter (intents and records are frozen pydantic models);
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
    ) -> None:
        """``approver_keys``: approver name -> Ed25519 public key (PEM, raw bytes or key
        object); when given, only decisions signed by those keys are accepted.
        ``search_attributes``: mirror pending approvals and parked calls into the Bool search
        attributes ``ExactcallPending`` and ``ExactcallUnresolved`` (for ``exactcall approvals
        list`` and ``exactcall unresolved``); the worker registers them if the cluster lets it.
        Keep both settings the same on every worker and replayer."""
        self._tools = list(tools) if tools is not None else None
        config = WorkflowConfig(
            verifier=ed25519_verifier(approver_keys) if approver_keys else None,
            search_attributes=search_attributes,
        )
        self.workflow_config = config
        self._worker_client: Client | None = None
        super().__init__(
            "exactcall.Plugin",
            data_converter=_data_converter,
            interceptors=[_Interceptor(config)],
            activities=self._activities,
            workflows=[CallRecord, Reconcile],
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
        tools = self.tools
        probes = [probe_activity(t) for t in tools if t.options.reconcile is not None]
        return [*(existing or []), *(tool_activity(t) for t in tools), *probes, await_settled]

    @contextlib.asynccontextmanager
    async def _run_context(self) -> AsyncIterator[None]:
        client = self._worker_client
        if client is not None and self.workflow_config.search_attributes:
            await ensure_search_attributes(client)
        yield

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        client = config.get("client")
        self._worker_client = client
        if client is not None and not _is_pydantic(client.data_converter):
            raise ExactcallError(
                "the worker's client does not use the pydantic data converter: put "
                "exactcall.Plugin() on Client.connect(plugins=[...]) rather than on the Worker"
            )
        return super().configure_worker(config)


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


def _is_pydantic(conv: DataConverter) -> bool:
    return issubclass(conv.payload_converter_class, PydanticPayloadConverter)


def _data_converter(existing: DataConverter | None) -> DataConverter:
    if existing is None or existing == DataConverter.default:
        return pydantic_data_converter
    if _is_pydantic(existing):
        return existing
    # keep the user's codec and failure converter, use the pydantic payload converter
    return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)


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
