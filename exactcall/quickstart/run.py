"""``exactcall quickstart``: a real crash and recovery in each agent framework that is installed.

For every framework whose extra is installed (OpenAI Agents SDK, Pydantic AI, LangGraph), two
agents with a fake model pay 10 once at a local demo bank, on the embedded Temporal server:
``PlainAgent`` on the framework's own Temporal integration (the payment is a plain activity),
and ``ExactcallAgent``, the same agent with the payment through exactcall. The worker process
is SIGKILLed right after the payment in both (the bank has paid, Temporal has not heard of
it), and a new worker takes over. The bank counts the payments: 2 for the plain agent (its
retry paid again), 1 with exactcall (the retry found the call's record, the probe found the
payment at the bank, nothing was sent twice).

The agents live in ``exactcall.quickstart.<framework>``; this module imports none of them
(the workers do), so it runs with any subset of the frameworks installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from temporalio.client import Client

from exactcall._crash import CRASH_ENV
from exactcall._plugin import Plugin
from exactcall.demo.bank import Bank
from exactcall.dev._procs import WorkerProcess
from exactcall.embedded._server import DevServer
from exactcall.quickstart._common import CRASH_PLAIN_ENV

__all__ = ["FRAMEWORKS", "Framework", "run_quickstart"]

AMOUNT = 10
MAX_WORKERS = 3  # per agent: the one SIGKILLed after the payment, then a healthy one
WORKER_START_TIMEOUT = 90.0
RESULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Framework:
    key: str
    """``exactcall.quickstart.<key>`` holds its two agents."""
    name: str
    extra: str
    requires: tuple[str, ...]
    """Import names that must be installed (the framework and its Temporal integration)."""
    prefix: str
    """Workflow types are ``Quickstart<prefix>Plain`` and ``Quickstart<prefix>Exactcall``."""

    @property
    def module(self) -> str:
        return f"exactcall.quickstart.{self.key}"

    @property
    def installed(self) -> bool:
        return all(_importable(name) for name in self.requires)


FRAMEWORKS = (
    Framework(
        "openai_agents",
        "OpenAI Agents SDK",
        "openai-agents",
        ("agents", "temporalio.openai_agents"),
        "Oa",
    ),
    Framework(
        "pydantic_ai",
        "Pydantic AI",
        "pydantic-ai",
        ("pydantic_ai", "pydantic_ai.durable_exec.temporal"),
        "Pai",
    ),
    Framework("langgraph", "LangGraph", "langgraph", ("langgraph", "temporalio.langgraph"), "Lg"),
)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@dataclass
class Result:
    framework: Framework
    plain_payments: int = 0
    exactcall_payments: int = 0
    kills: int = 0
    plain_answer: str = ""
    exactcall_answer: str = ""
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exactcall_payments == 1

    def line(self) -> str:
        name = f"{self.framework.name:<18}"
        if self.error:
            return f"{name} FAILED: {self.error}"
        plain = _payments(self.plain_payments)
        exact = _payments(self.exactcall_payments)
        twice = "the retry paid again" if self.plain_payments > 1 else "not repeated"
        once = "not re-sent" if self.exactcall_payments == 1 else "DUPLICATE"
        return (
            f"{name} plain: {plain} ({twice})   exactcall: {exact} ({once})   {self.seconds:.1f} s"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "framework": self.framework.name,
            "extra": self.framework.extra,
            "plain_payments": self.plain_payments,
            "exactcall_payments": self.exactcall_payments,
            "worker_kills": self.kills,
            "plain_answer": self.plain_answer,
            "exactcall_answer": self.exactcall_answer,
            "seconds": round(self.seconds, 2),
            "ok": self.ok,
            "error": self.error,
        }


def _payments(n: int) -> str:
    return f"{n} payment" + ("" if n == 1 else "s")


@dataclass
class Quickstart:
    server: DevServer
    bank: Bank
    client: Client
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    workers: list[WorkerProcess] = field(default_factory=list)

    def spawn(self, fw: Framework, kind: str, task_queue: str, n: int) -> WorkerProcess:
        # each crash rule fires in an activity's first attempt only: the retry, on the next
        # worker, runs normally
        crash = {CRASH_PLAIN_ENV: "1"} if kind == "plain" else {CRASH_ENV: "*:after_call:1"}
        wp = WorkerProcess(
            self.server.address,
            task_queue,
            tools=[fw.module],
            workflows=[fw.module],
            plugins=[f"{fw.module}:plugins"],
            env={**crash, "PYTHONUNBUFFERED": "1"},
            name=f"{fw.key}-{kind}-{n}",
        )
        self.workers.append(wp)
        return wp

    async def run(self, fw: Framework) -> Result:
        result = Result(fw)
        began = time.monotonic()
        try:
            plain, exact = await asyncio.wait_for(
                asyncio.gather(self._agent(fw, "plain"), self._agent(fw, "exactcall")),
                RESULT_TIMEOUT,
            )
        except Exception as exc:  # shown on the framework's line; the others go on
            result.error = f"{type(exc).__name__}: {exc}"
        else:
            result.plain_answer, result.plain_payments, kills_plain = plain
            result.exactcall_answer, result.exactcall_payments, kills_exact = exact
            result.kills = kills_plain + kills_exact
        result.seconds = time.monotonic() - began
        return result

    async def _agent(self, fw: Framework, kind: str) -> tuple[str, int, int]:
        """Run one agent (its own task queue and workers) until it finishes; restart its
        worker each time it is SIGKILLed. Its answer, the payments at the bank, the kills."""
        tq = f"quickstart-{fw.key}-{kind}-{self.run_id}"
        account = f"{kind}-{fw.key}-{self.run_id}"
        kills = 0
        worker = await self.spawn(fw, kind, tq, 1).started(WORKER_START_TIMEOUT)
        handle = await self.client.start_workflow(
            f"Quickstart{fw.prefix}{kind.capitalize()}",
            args=[self.bank.url, account],
            id=f"quickstart-{fw.key}-{kind}-{self.run_id}",
            task_queue=tq,
            result_type=str,
        )
        done = asyncio.ensure_future(handle.result())
        try:
            while True:
                died = asyncio.ensure_future(worker.killed(RESULT_TIMEOUT))
                await asyncio.wait({done, died}, return_when=asyncio.FIRST_COMPLETED)
                if done.done():
                    died.cancel()
                    break
                kills += 1
                if kills >= MAX_WORKERS:
                    raise RuntimeError(f"the {kind} agent's workers kept dying")
                worker = await self.spawn(fw, kind, tq, kills + 1).started(WORKER_START_TIMEOUT)
            answer = done.result()
        finally:
            done.cancel()
        return answer, self.bank.count(to=account), kills

    def stop(self) -> None:
        for wp in self.workers:
            wp.stop()


AFTER_THE_CRASH = """
exactcall's pay declares reconcile=find_payment (a probe that asks the bank for the call's
key) and heartbeat_timeout=2s: after the kill the probe finds the payment, so the run finishes
by itself. A tool with neither a probe nor provider_idempotent=True would wait for a person
instead (`exactcall unresolved`, `exactcall resolve`): never a blind re-send."""


async def run_quickstart(
    only: Sequence[str] = (), *, as_json: bool = False, out: TextIO | None = None
) -> int:
    """Exit 0 when every installed framework paid once with exactcall, 1 otherwise (or when no
    framework is installed), 2 for an unknown ``only`` name."""
    out = out or sys.stdout
    known = {fw.key: fw for fw in FRAMEWORKS} | {fw.extra: fw for fw in FRAMEWORKS}
    unknown = [name for name in only if name not in known]
    if unknown:
        print(
            f"exactcall quickstart: unknown framework {', '.join(unknown)}; choose from "
            f"{', '.join(fw.extra for fw in FRAMEWORKS)}",
            file=sys.stderr,
        )
        return 2
    chosen = [known[name] for name in only] if only else list(FRAMEWORKS)
    installed = [fw for fw in chosen if fw.installed]
    if not installed:
        extras = ",".join(fw.extra for fw in chosen)
        print(
            "exactcall quickstart: no agent framework is installed. Install one or all of them:\n"
            + "".join(f"  pip install 'exactcall[{fw.extra}]'   # {fw.name}\n" for fw in chosen)
            + f"  pip install 'exactcall[{'agents' if len(chosen) > 1 else extras}]'",
            file=out,
        )
        return 1
    began = time.monotonic()
    results = await _run_all(installed, out, quiet=as_json)
    if as_json:
        print(json.dumps({"frameworks": [r.as_json() for r in results]}, indent=2), file=out)
    else:
        for r in results:
            print("  " + r.line(), file=out)
        missing = [fw for fw in chosen if not fw.installed]
        for fw in missing:
            print(f"  {fw.name:<18} not installed: pip install 'exactcall[{fw.extra}]'", file=out)
        print(AFTER_THE_CRASH, file=out)
        print(f"\nfinished in {time.monotonic() - began:.1f} s", file=out)
    return 0 if all(r.ok for r in results) else 1


async def _run_all(frameworks: Sequence[Framework], out: TextIO, quiet: bool) -> list[Result]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="exactcall-qs-")))
        server = stack.enter_context(DevServer(fast=True, headless=True, db=tmp / "temporal.db"))
        bank = stack.enter_context(Bank(tmp / "bank.db"))
        client = await Client.connect(server.address, plugins=[Plugin()])
        if not quiet:
            print(
                f"exactcall quickstart on the embedded Temporal server ({server.address}):\n"
                f"each agent pays {AMOUNT} once with a fake model; its worker is SIGKILLed right "
                "after the payment, then a new worker takes over\n",
                file=out,
                flush=True,
            )
        qs = Quickstart(server, bank, client)
        stack.callback(qs.stop)
        results = list(await asyncio.gather(*(qs.run(fw) for fw in frameworks)))
    return results
