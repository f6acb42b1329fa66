"""The ``exactcall.budget`` local activity: a workflow's reservations on a budget's ledger.

Every operation goes through this process's queue for its ledger: one Update in flight per
process and ledger (``exactcall.budget.batch``), carrying every operation that arrived while
the previous one was out, in order. Temporal refuses more than 10 Updates in flight per
workflow (on Cloud too); one per process keeps a fleet of hundreds of callers under it, and
what a larger fleet still meets (``RESOURCE_EXHAUSTED``, an Update aborted when the ledger
continued as new) is sent again after a short, random backoff: each operation is idempotent
by its call's key. A batch is an Update-with-Start (the ledger starts at its budget's first
call, on ``BUDGET_TASK_QUEUE``); a batch of settles only is a signal (nothing waits for the
ledger's workflow task), and to a ledger that has closed (idle for days, nothing reserved)
there is nothing left to settle. A reservation the ledger refuses comes back as ``ok=False``
with the ledger's figures.

The activity returns once its operations are in the ledger (a reservation: accepted and
answered; a settle: the signal or Update accepted by the server), so a marker in the caller's
history always means the ledger has it.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from exactcall._wire import (
    BUDGET_ACTIVITY,
    BUDGET_BATCH_SIGNAL,
    BUDGET_BATCH_UPDATE,
    BUDGET_OVER,
    BUDGET_TASK_QUEUE,
    BUDGET_WORKFLOW,
)
from exactcall.budgets._budget import BatchAnswer, ChargeAnswer, ChargeBatch, ChargeOp, ledger_input

__all__ = ["STATS", "budget_charge"]

OVER = BUDGET_OVER
MAX_BATCH = 500
"""Operations per Update (a ChargeOp is ~0.5 KB: far under Temporal's 2 MB payload limit)."""
BACKOFF = (0.05, 2.0)
"""First and longest wait before an operation refused for load is sent again (seconds)."""
_AGAIN = {RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.ABORTED}
STATS: dict[str, int] = {}
"""What this process sent to ledgers (bench/budget.py reads it): Updates, signals, operations,
and each sending that was refused for load and sent again, by status."""


@activity.defn(name=BUDGET_ACTIVITY)
async def budget_charge(op: ChargeOp) -> ChargeAnswer:
    client = activity.client()
    carried = [s for s in op.settles if s.ledger_id != op.ledger_id]
    own = [s for s in op.settles if s.ledger_id == op.ledger_id]
    main = op.model_copy(update={"settles": ()})
    # another ledger's carried spends go at the same time; this ledger's, in the same batch
    results = await asyncio.gather(
        _queue(client, main.ledger_id).submit([*own, main]),
        *(_queue(client, s.ledger_id).submit([s]) for s in carried),
    )
    return results[0][-1]


def _queue(client: Client, ledger_id: str) -> _LedgerQueue:
    by_id = _QUEUES.setdefault(client, {})
    q = by_id.get(ledger_id)
    if q is None or q.loop is not asyncio.get_running_loop():
        q = by_id[ledger_id] = _LedgerQueue(client, ledger_id)
    return q


class _LedgerQueue:
    """This process's operations for one ledger, sent one batch at a time."""

    def __init__(self, client: Client, ledger_id: str) -> None:
        self.client = client
        self.ledger_id = ledger_id
        self.loop = asyncio.get_running_loop()
        self.waiting: list[tuple[ChargeOp, asyncio.Future[ChargeAnswer]]] = []
        self.sender: asyncio.Task[None] | None = None
        self.running = False
        """The ledger answered this process: a plain Update reaches it (no start with it)."""

    async def submit(self, ops: Sequence[ChargeOp]) -> list[ChargeAnswer]:
        futs = []
        for op in ops:
            fut: asyncio.Future[ChargeAnswer] = self.loop.create_future()
            self.waiting.append((op, fut))
            futs.append(fut)
        if self.sender is None or self.sender.done():
            self.sender = self.loop.create_task(self._send_all())
        # shielded: an attempt that times out leaves its operations to go (each idempotent)
        return list(await asyncio.shield(asyncio.gather(*futs)))

    async def _send_all(self) -> None:
        while self.waiting:
            batch, self.waiting = self.waiting[:MAX_BATCH], self.waiting[MAX_BATCH:]
            try:
                answers = await self._send([op for op, _ in batch])
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, fut), answer in zip(batch, answers, strict=True):
                if not fut.done():
                    fut.set_result(answer)

    async def _send(self, ops: list[ChargeOp]) -> list[ChargeAnswer]:
        wait = BACKOFF[0]
        while True:
            try:
                return await self._send_once(ops)
            except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError) as exc:
                status = getattr(exc, "status", None)
                if isinstance(exc, RPCError) and status not in _AGAIN:
                    raise
                name = status.name if status is not None else "UPDATE_TIMEOUT"
                STATS[f"again_{name}"] = STATS.get(f"again_{name}", 0) + 1
            except WorkflowUpdateFailedError as exc:
                if not _aborted(exc):
                    raise
                STATS["again_ABORTED"] = STATS.get("again_ABORTED", 0) + 1
            await asyncio.sleep(random.uniform(wait / 2, wait))
            wait = min(wait * 2, BACKOFF[1])

    async def _send_once(self, ops: list[ChargeOp]) -> list[ChargeAnswer]:
        reserve = next((op for op in ops if op.op == "reserve"), None)
        STATS["ops"] = STATS.get("ops", 0) + len(ops)
        if reserve is None:
            return await self._settle_only(ops)
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            BUDGET_WORKFLOW,
            ledger_input(reserve),
            id=self.ledger_id,
            task_queue=BUDGET_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"budget {reserve.budget} (limit {reserve.limit:g})",
        )
        STATS["updates"] = STATS.get("updates", 0) + 1
        try:
            answer = await self._update(ChargeBatch(ops=ops), start)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type == OVER:  # all refused
                figures = cause.details[0] if cause.details else [{}] * len(ops)
                return [_over(op, f) for op, f in zip(ops, figures, strict=True)]
            raise
        return answer.answers

    async def _update(self, batch: ChargeBatch, start: WithStartWorkflowOperation) -> BatchAnswer:
        """A plain Update once the ledger has answered this process (cheaper for the server
        than Update-with-Start); with the start again if it has closed since."""
        if self.running:
            try:
                handle = self.client.get_workflow_handle(self.ledger_id)
                return await handle.execute_update(
                    BUDGET_BATCH_UPDATE, batch, result_type=BatchAnswer
                )
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                self.running = False  # closed (idle): started again with this batch
        answer = await self.client.execute_update_with_start_workflow(
            BUDGET_BATCH_UPDATE, batch, start_workflow_operation=start, result_type=BatchAnswer
        )
        self.running = True
        return answer

    async def _settle_only(self, ops: list[ChargeOp]) -> list[ChargeAnswer]:
        STATS["signals"] = STATS.get("signals", 0) + 1
        state = "sent"
        try:
            handle = self.client.get_workflow_handle(self.ledger_id)
            await handle.signal(BUDGET_BATCH_SIGNAL, ChargeBatch(ops=ops))
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            state = "none"  # the ledger has closed: nothing was reserved any more
        return [ChargeAnswer(ok=True, state=state, limit=op.limit, window=op.window) for op in ops]


def _over(op: ChargeOp, figures: dict[str, float]) -> ChargeAnswer:
    return ChargeAnswer(
        ok=False,
        spent=figures.get("spent", 0.0),
        reserved=figures.get("reserved", 0.0),
        limit=figures.get("limit", op.limit),
        window=op.window,
    )


def _aborted(exc: WorkflowUpdateFailedError) -> bool:
    """An Update the server dropped before the ledger took it (it continued as new, or its
    workflow task failed): nothing of it was applied, so it is sent again."""
    cause = exc.cause
    text = str(cause or exc).lower()
    return "aborted" in text or ("continue" in text and "new" in text)


_QUEUES: weakref.WeakKeyDictionary[Client, dict[str, _LedgerQueue]] = weakref.WeakKeyDictionary()
