"""Activities of reconciliation: a tool's probe, waiting for a settlement, and writing a
verdict to the call's record."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.client import WorkflowFailureError

from exactcall._context import running
from exactcall._crash import maybe_crash
from exactcall._errors import ExactcallError
from exactcall._model import Intent, RecordEvent
from exactcall._tool import Tool
from exactcall._wire import AWAIT_SETTLED, MARK_RECORD, probe_activity_name
from exactcall.activities._records import Record
from exactcall.reconciliation._verdicts import Settled, Verdict, to_verdict

__all__ = ["await_settled", "mark_record", "probe_activity"]


def probe_activity(t: Tool) -> Callable[[Intent], Awaitable[Verdict]]:
    """The activity that runs ``t``'s reconcile probe (read-only: it may run many times)."""
    probe = t.options.reconcile
    assert probe is not None

    async def run(intent: Intent) -> Verdict:
        maybe_crash("in_probe", intent.tool, activity.info().attempt, intent.step)
        with running(intent):
            if inspect.iscoroutinefunction(probe):
                work = asyncio.ensure_future(probe(intent))
            else:
                work = asyncio.ensure_future(asyncio.to_thread(probe, intent))
            beat = max(0.2, t.options.heartbeat_timeout.total_seconds() / 4)
            while not work.done():  # heartbeat, so a probe on a dead worker is retried soon
                activity.heartbeat()
                await asyncio.wait({work}, timeout=beat)
            answer = work.result()
        verdict = to_verdict(answer)
        activity.logger.info("probe %s %s: %s", intent.tool, intent.step, verdict.kind)
        return verdict

    run.__name__ = run.__qualname__ = f"exactcall_probe_{t.name}"
    return activity.defn(name=probe_activity_name(t.name))(run)


@activity.defn(name=AWAIT_SETTLED)
async def await_settled(reconcile_workflow_id: str) -> Settled:
    """Wait for a reconciliation started by an earlier run of the calling workflow."""
    handle = activity.client().get_workflow_handle(reconcile_workflow_id, result_type=Settled)
    result = asyncio.ensure_future(handle.result())
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=10)
            if done:
                break
            activity.heartbeat()
        return result.result()
    except WorkflowFailureError as err:
        raise ExactcallError(
            f"reconciliation {reconcile_workflow_id} did not settle: {err}"
        ) from err
    finally:
        if not result.done():
            result.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await result


@activity.defn(name=MARK_RECORD)
async def mark_record(intent: Intent, event: RecordEvent) -> None:
    """Write a marker to the record of ``intent``'s key from workflow code (a reconciliation's
    verdict), opening the record again if it has closed."""
    await Record(activity.client(), intent).mark(event)
