"""The small worker that runs budget ledgers, next to every worker that runs budgeted calls.

A ledger lives on ``BUDGET_TASK_QUEUE``, not on its first caller's task queue: a caller's
queue can go away (a deploy that renames it, a test's own queue) while the ledger must go on
answering. Every worker that runs the workflows of budgeted tools starts one of these beside
itself (``exactcall.Plugin`` does, for as long as that worker runs), so wherever callers run,
something polls the ledgers' queue; a ledger's workflow tasks stay on one of them (sticky)
and move to another within a second when it stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from exactcall._wire import BUDGET_TASK_QUEUE

__all__ = ["ledger_worker"]

STICKY = timedelta(seconds=1)
"""A ledger cached by a worker that stopped is taken by another after this long."""


@contextlib.asynccontextmanager
async def ledger_worker(client: Client) -> AsyncIterator[Worker]:
    """Run a worker of the budget ledgers (``BudgetLedger`` only) while the block runs.

    It is built from a copy of ``client`` without its plugins (exactcall's plugin would add
    tools and its other workflows to it), with the client's data converter and interceptors.
    """
    from exactcall.workflows import BudgetLedger

    config = client.config(active_config=True)  # the converter the plugins chose
    config["plugins"] = []
    bare = Client(**config)
    worker = Worker(
        bare,
        task_queue=BUDGET_TASK_QUEUE,
        workflows=[BudgetLedger],
        max_concurrent_workflow_task_polls=2,
        sticky_queue_schedule_to_start_timeout=STICKY,
    )
    async with worker:
        yield worker
