"""The agent workflow and the four tools of ``bench/soak.py`` (the killed-worker fleet soak).

Served by worker processes started as ``python -m exactcall worker --tools
bench._soak_workflows --workflows bench._soak_workflows`` with the repo root as the working
directory. Every tool pays at the demo bank (``exactcall.demo.bank``), which is where the soak
counts effects; the tools themselves count nothing.

* ``soak_plain``: no key, no probe; a crash inside it makes its outcome unknown, and the
  agent (``on_unknown="raise"``) goes on while the call stays parked for a person;
* ``soak_idem``: provider-idempotent; a crashed attempt is re-sent with the same key and the
  bank replays its receipt;
* ``soak_approved``: waits for an approval of its exact arguments (the soak's bot gives it),
  then pays like ``soak_idem``;
* ``soak_probed``: sends its key, but is settled after a crash by asking the bank for it
  (:func:`find_soak_payment`).

``plugins()`` (``--plugin bench._soak_workflows:plugins``) adds an activity interceptor that
appends one JSON line when an attempt of a soak tool activity or probe starts and one when it
ends, to ``$SOAK_ATTEMPTS_FILE`` (pid, time, the call's workflow id and step): an attempt
with a start and no end was running on a process that died. The soak matches those with its
kills to time how the interrupted calls settled. Environment, read at import so every worker
of one soak sees the same values: ``SOAK_HEARTBEAT_S`` (the tools' heartbeat timeout; unset:
exactcall's default) and ``SOAK_PAUSE_MS`` (each tool body sleeps up to this long before and
after its payment, like a real API, so that kills land inside calls).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.plugin import SimplePlugin
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo.bank_client import post_payment, receipt_with_key

__all__ = [
    "AGENT",
    "ATTEMPTS_ENV",
    "HEARTBEAT_ENV",
    "PAUSE_ENV",
    "PLAIN",
    "TOOLS",
    "SoakAgent",
    "find_soak_payment",
    "plugins",
]

AGENT = "SoakAgent"
PLAIN, IDEM, APPROVED, PROBED = "soak_plain", "soak_idem", "soak_approved", "soak_probed"
TOOLS = (PLAIN, IDEM, APPROVED, PROBED)
ATTEMPTS_ENV = "SOAK_ATTEMPTS_FILE"
HEARTBEAT_ENV = "SOAK_HEARTBEAT_S"
PAUSE_ENV = "SOAK_PAUSE_MS"


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    return float(raw) if raw else None


_HB_S = _env_float(HEARTBEAT_ENV)
HEARTBEAT = timedelta(seconds=_HB_S) if _HB_S else None  # None: exactcall's default
PAUSE_S = (_env_float(PAUSE_ENV) or 0.0) / 1000


# -- attempt log (the soak's settle times; not an effect count) --------------------------------
def _log_line(row: dict[str, Any]) -> None:
    """One O_APPEND write: a line written before a SIGKILL survives it."""
    path = os.environ.get(ATTEMPTS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


class _AttemptLog(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        intent = input.args[0] if input.args else None
        if not info.activity_type.split(".")[-1].startswith("soak_") or intent is None:
            return await self.next.execute_activity(input)
        row = {
            "id": uuid.uuid4().hex,
            "kind": "probe" if info.activity_type.startswith("exactcall.probe.") else "call",
            "pid": os.getpid(),
            "wf": getattr(intent, "workflow_id", None),
            "step": getattr(intent, "step", None),
            "attempt": info.attempt,
        }
        _log_line({**row, "ev": "start", "t": time.time()})
        try:
            return await self.next.execute_activity(input)
        finally:
            _log_line({**row, "ev": "end", "t": time.time()})


class _Interceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _AttemptLog(next)


def plugins() -> list[Any]:
    """The soak's worker plugin: the attempt log (``exactcall worker --plugin``)."""
    return [SimplePlugin("exactcall.soak.attempts", interceptors=[_Interceptor()])]


async def _pay(bank: str, amount: int, to: str, keyed: bool) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0, PAUSE_S))
    headers = exactcall.idempotency_headers() if keyed else None
    receipt = await asyncio.to_thread(post_payment, bank, amount, to, headers)
    await asyncio.sleep(random.uniform(0, PAUSE_S))  # the effect happened; not yet recorded
    return receipt


# -- tools ------------------------------------------------------------------------------------
@exactcall.tool(name=PLAIN, heartbeat_timeout=HEARTBEAT)
async def soak_plain(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay without a key and without a probe: after a crash inside it, it is parked."""
    return await _pay(bank, amount, to, keyed=False)


@exactcall.tool(name=IDEM, provider_idempotent=True, heartbeat_timeout=HEARTBEAT)
async def soak_idem(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay with the call's key; the bank dedupes it, so a crashed attempt is re-sent."""
    return await _pay(bank, amount, to, keyed=True)


@exactcall.tool(name=APPROVED, approval=True, provider_idempotent=True, heartbeat_timeout=HEARTBEAT)
async def soak_approved(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay once these exact arguments are approved (the bank dedupes the key)."""
    return await _pay(bank, amount, to, keyed=True)


def find_soak_payment(intent: exactcall.Intent) -> Any:
    """Probe of ``soak_probed``: did the bank book a payment under the call's key?"""
    receipt = receipt_with_key(str(intent.args["bank"]), intent.key)
    return exactcall.NotLanded() if receipt is None else exactcall.Landed(receipt)


@exactcall.tool(name=PROBED, reconcile=find_soak_payment, heartbeat_timeout=HEARTBEAT)
async def soak_probed(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay with the key recorded at the bank (not trusted to dedupe); probed after a crash."""
    return await _pay(bank, amount, to, keyed=True)


# -- the agent --------------------------------------------------------------------------------
@workflow.defn(name=AGENT)
class SoakAgent:
    """One run: the four tools once each, in the order given, each paying a distinct amount
    (1, 2, 3, 4) to the run's own account (at ``job["bank"]``, or at ``job["banks"][amount]``,
    a chaos proxy in front of it, for the calls that get a provider fault). Returns one row
    per call: its outcome and when the agent got it (``workflow.now()``, the start of the
    workflow task that saw it)."""

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        rows = []
        banks = job.get("banks") or {}  # amount -> URL: a chaos proxy for some calls
        for amount, tool in enumerate(job["order"], start=1):
            bank = banks.get(str(amount), job["bank"])
            rows.append(await self._call(bank, job["account"], amount, tool))
        return rows

    async def _call(self, bank: str, account: str, amount: int, tool: str) -> dict[str, Any]:
        row: dict[str, Any] = {"tool": tool, "step": f"{tool}#1", "amount": amount}
        on_unknown = "raise" if tool == PLAIN else None
        try:
            receipt = await exactcall.call(tool, bank, amount, account, on_unknown=on_unknown)
            row.update(outcome="done", payment_id=receipt["payment_id"])
        except exactcall.AmbiguousOutcome as err:
            row.update(outcome="unknown", reason=str(err.fields.get("reason") or err.message))
        except exactcall.ExactcallError as err:  # reported as lost by the soak
            row.update(outcome="error", error=err.code, reason=err.message)
        row["settled_at"] = workflow.now().timestamp()
        return row
