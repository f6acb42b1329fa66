"""Connecting to Temporal and running a worker for tools and workflows named by module path."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.service import TLSConfig
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from exactcall._crash import warn_if_unarmed
from exactcall._plugin import Plugin
from exactcall._tool import Tool

__all__ = [
    "Connection",
    "build_worker",
    "connect",
    "load_activities",
    "load_plugins",
    "load_tools",
    "load_workflows",
    "run_worker",
]

log = structlog.get_logger("exactcall")


@dataclass(frozen=True)
class Connection:
    """Where Temporal is. Unset fields come from TEMPORAL_* environment variables / profile."""

    address: str | None = None
    namespace: str | None = None
    api_key: str | None = None
    tls: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
        kw.setdefault("target_host", "localhost:7233")
        if self.address:
            kw["target_host"] = self.address
        if self.namespace:
            kw["namespace"] = self.namespace
        if self.api_key:
            kw["api_key"] = self.api_key
        if self.tls or self.tls_cert or self.tls_ca or self.api_key:
            kw["tls"] = self._tls_config(kw.get("tls"))
        return kw

    def _tls_config(self, existing: Any) -> TLSConfig | bool:
        if not (self.tls_cert or self.tls_key or self.tls_ca):
            return existing if isinstance(existing, TLSConfig) else True
        return TLSConfig(
            client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
            client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
            server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
        )


async def connect(
    conn: Connection | None = None,
    plugin: Plugin | None = None,
    others: Sequence[Any] = (),
    **client_kwargs: Any,
) -> Client:
    """A Client with exactcall's plugin (data converter, interceptors, tools) installed, then
    ``others`` (an agent framework's Temporal plugin, for example). ``client_kwargs`` go to
    ``Client.connect`` (``runtime=`` for metrics, ``interceptors=`` for tracing)."""
    kw = {**(conn or Connection()).connect_kwargs(), **client_kwargs}
    target = kw.pop("target_host")
    return await Client.connect(target, plugins=[plugin or Plugin(), *others], **kw)


def load_plugins(specs: Sequence[str]) -> list[Any]:
    """``module:NAME``: a Temporal plugin object, a plugin class, or a function that returns
    one or a list of them (called with no arguments)."""
    found: list[Any] = []
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not sep or not attr:
            raise ValueError(f"--plugin {spec!r}: expected MODULE:NAME (a plugin or a factory)")
        obj = getattr(importlib.import_module(module_name), attr)
        if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "configure_client")):
            obj = obj()  # a plugin class (PydanticAIPlugin) or a factory function
        plugins = list(obj) if isinstance(obj, list | tuple) else [obj]
        for pl in plugins:
            if not hasattr(pl, "configure_client") and not hasattr(pl, "configure_worker"):
                raise TypeError(
                    f"--plugin {spec!r} gave {pl!r}, which is not a Temporal plugin (a "
                    "temporalio.plugin.SimplePlugin, client.Plugin or worker.Plugin)"
                )
        found += plugins
    return found


def load_workflows(specs: Sequence[str]) -> list[type]:
    """Import ``module:Class`` (or ``module`` for every workflow class it defines)."""
    found: list[type] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        module = importlib.import_module(module_name)
        if attr:
            found.append(getattr(module, attr))
        else:
            found += [
                v
                for v in vars(module).values()
                if isinstance(v, type)
                and hasattr(v, "__temporal_workflow_definition")
                and v.__module__ == module.__name__
            ]
    return found


def load_tools(modules: Sequence[str]) -> list[Tool]:
    """Import modules and return the exactcall tools each one defines."""
    tools: dict[str, Tool] = {}
    for name in modules:
        module = importlib.import_module(name)
        for v in vars(module).values():
            if isinstance(v, Tool):
                tools[v.name] = v
    return list(tools.values())


def load_activities(modules: Sequence[str]) -> list[Any]:
    """Plain Temporal activities (``@activity.defn``) defined in the modules."""
    found: dict[str, Any] = {}
    for name in modules:
        module = importlib.import_module(name)
        for v in vars(module).values():
            if callable(v) and hasattr(v, "__temporal_activity_definition"):
                found[getattr(v, "__temporal_activity_definition").name] = v
    return list(found.values())


def passthrough_all_runner() -> SandboxedWorkflowRunner:
    """The sandbox with every module passed through (``exactcall worker
    --passthrough-all-modules``): a workflow run re-imports nothing, and the plugin still adds
    its own passthroughs; calls that are not deterministic are still refused."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_all_modules()
    )


def build_worker(
    client: Client,
    task_queue: str,
    workflows: Sequence[type] = (),
    *,
    activities: Sequence[Any] = (),
    sticky_timeout: timedelta | None = None,
    graceful_shutdown_timeout: timedelta = timedelta(seconds=10),
    **worker_kwargs: Any,
) -> Worker:
    """A Worker on ``task_queue``; tools and exactcall's workflows come from the plugin."""
    if any(not _is_async(a) for a in activities):
        worker_kwargs.setdefault("activity_executor", ThreadPoolExecutor(max_workers=32))
    if sticky_timeout is not None:
        worker_kwargs["sticky_queue_schedule_to_start_timeout"] = sticky_timeout
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=list(activities),
        graceful_shutdown_timeout=graceful_shutdown_timeout,
        **worker_kwargs,
    )


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        type(fn).__call__ if not inspect.isfunction(fn) else None
    )


async def run_worker(worker: Worker) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully (in-flight tool calls finish)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warn_if_unarmed(
        [
            *worker.config(active_config=True).get("interceptors", []),
            *worker.client.config(active_config=True).get("interceptors", []),
        ]
    )
    async with worker:
        log.info("worker.started", task_queue=worker.task_queue)
        await stop.wait()
        log.info("worker.stopping", task_queue=worker.task_queue)
