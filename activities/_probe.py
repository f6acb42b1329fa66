"""Activities of reconciliation: a tool's probe, and waiting for a settlement."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

from exactcall.workflows import probe_activity_name
from temporalio import activity
from temporalio.client import WorkflowFailureError

from exactcall._context import running
from exactcall._errors import ExactcallError
from exactcall._model import Intent
from exactcall._reconcile import Settled, Verdict, to_verdict
from exactcall._settle import AWAIT_SETTLED
from exactcall._tool import Tool

__all__ = ["await_settled", "probe_activity"]


def probe_activity(t: Tool) -> Callable[[Intent], Awaitable[Verdict]]:
    """The activity that runs ``t``'s reconcile probe (read-only: it may run many times)."""
    probe = t.options.reconcile
    assert probe is not None

    async def run(intent: Intent) -> Verdict:
        with running(intent):
            if inspect.iscoroutinefunction(probe):
                answer = await probe(intent)
            else:
                answer = await asyncio.to_thread(probe, intent)
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
