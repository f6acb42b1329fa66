"""The calling side's small pieces: what a call workflow was started with, its intent as
exactcall recorded it, results typed, and the checks of where a session is used."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle

from exactcall._canonical import derive_key
from exactcall._errors import ExactcallError
from exactcall._model import Intent
from exactcall._plugin import Plugin
from exactcall._tool import Tool
from exactcall._wire import SESSION_CALL_WORKFLOW
from exactcall.session._workflow import CallInput, Outcome

__all__ = [
    "check_plugin",
    "input_of",
    "intent_of_call",
    "may_wait_for_a_person",
    "not_in_workflow",
    "typed",
]


def intent_of_call(client: Client, t: Tool, inp: CallInput, wid: str) -> Intent:
    """The intent exactcall recorded for a session call (its key derived from ``wid``)."""
    ns = client.namespace
    return Intent(
        tool=t.name,
        tool_version=t.version,
        args=inp.args,
        args_hash=inp.args_hash,
        namespace=ns,
        workflow_id=wid,
        workflow_type=SESSION_CALL_WORKFLOW,
        step=inp.step,
        key=derive_key(ns, wid, inp.step, t.name, t.version),
        explicit_key=inp.explicit_key,
        record_task_queue="",
    )


async def input_of(client: Client, handle: WorkflowHandle[Any, Outcome]) -> CallInput:
    """The input an existing call workflow was started with (its first event)."""
    async for ev in handle.fetch_history_events():
        payloads = ev.workflow_execution_started_event_attributes.input.payloads
        [inp] = await client.data_converter.decode(payloads, [CallInput])
        return inp
    raise ExactcallError(f"workflow {handle.id} has no history")


def may_wait_for_a_person(t: Tool) -> bool:
    return bool(t.options.approval) or bool(t.options.budgets)


def typed(t: Tool, value: Any) -> Any:
    """As a workflow's call gives it: typed by the return annotation, or the recorded JSON."""
    return t.typed_result(value)[0]


def not_in_workflow(what: str) -> None:
    if workflow.in_workflow():
        raise ExactcallError(
            f"{what} is for code that is not a Temporal workflow; inside a workflow use "
            "exactcall.call(tool, ...), which makes the call part of the workflow's history"
        )


def check_plugin(client: Client) -> None:
    plugins = client.config().get("plugins") or []
    if not any(isinstance(p, Plugin) for p in plugins):
        raise ExactcallError(
            "exactcall.session(client=...) needs a client with exactcall's plugin: "
            "Client.connect(..., plugins=[exactcall.Plugin()])"
        )
