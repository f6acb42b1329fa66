"""``exactcall.Plugin``: one object that wires exactcall into a Temporal Client and Worker."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    Interceptor,
    WorkerConfig,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from exactcall.activities import tool_activity
from exactcall.workflows import CallRecord

from ._call import WorkflowInterceptor
from ._errors import ExactcallError
from ._tool import Tool, registered_tools

__all__ = ["Plugin"]

# Modules passed through the workflow sandbox, and why:
_PASSTHROUGH = (
    "exactcall",  # one tool registry and one set of error classes for the whole worker
    "structlog",  # imported by exactcall modules; workflows log through workflow.logger only
    "rfc8785",  # pure canonical-JSON encoder, no state
)


class _Interceptor(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return WorkflowInterceptor.inbound_class()


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

    def __init__(self, tools: Sequence[Tool] | None = None) -> None:
        self._tools = list(tools) if tools is not None else None
        super().__init__(
            "exactcall.Plugin",
            data_converter=_data_converter,
            interceptors=[_Interceptor()],
            activities=self._activities,
            workflows=[CallRecord],
            workflow_runner=_workflow_runner,
            workflow_failure_exception_types=[ExactcallError],
        )

    @property
    def tools(self) -> list[Tool]:
        return self._tools if self._tools is not None else registered_tools()

    def _activities(
        self, existing: Sequence[Callable[..., Any]] | None
    ) -> list[Callable[..., Any]]:
        return [*(existing or []), *(tool_activity(t) for t in self.tools)]

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        client = config.get("client")
        if client is not None and not _is_pydantic(client.data_converter):
            raise ExactcallError(
                "the worker's client does not use the pydantic data converter: put "
                "exactcall.Plugin() on Client.connect(plugins=[...]) rather than on the Worker"
            )
        return super().configure_worker(config)


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
