"""``exactcall.saga()``: undo the calls made in a block, newest first, each once.

Every call that is done inside the block (in its task or a task started from it: a
ContextVar) is noted with its step, key, canonical arguments and result. ``undo()`` then calls
each one's undo tool (``@t.undo``) as an exactcall call of its own, at the step
``<step>.undo``, so its key is derived from the workflow id and the undone step: it runs once
across crashes, retries, resets and re-runs of the workflow id, may need approval, and an
unknown outcome goes to reconciliation like any call's. Leaving the block with an exception
undoes; leaving it normally does not.
"""

from __future__ import annotations

import asyncio
from contextvars import Token
from types import TracebackType
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from exactcall._canonical import to_json_value
from exactcall._errors import AmbiguousOutcome, ExactcallError, ToolFailed
from exactcall._model import Intent
from exactcall._tool import Tool, resolve_tool
from exactcall._wire import (
    UNDO_FAILED_MEMO,
    UNDO_KEYS_OF_THE_RUN,
    UNDO_WORKFLOW,
    UNRESOLVED_ATTRIBUTE,
)
from exactcall.reconciliation._verdicts import CallAbandoned
from exactcall.undo._undo import Done, RunUndoReport, UndoFailed, UndoInput, UndoReport, undo_step
from exactcall.workflows._call import call_with
from exactcall.workflows._saga_stage import OPEN, Noter, done_of
from exactcall.workflows._state import state
from exactcall.workflows._unknown import OnUnknown, await_verdict

__all__ = ["Saga", "UndoRun", "saga"]

UNRESOLVED_KEY = SearchAttributeKey.for_bool(UNRESOLVED_ATTRIBUTE)


class Saga:
    """The calls of one ``async with exactcall.saga() as s:`` block, to undo."""

    def __init__(self) -> None:
        self._calls: list[Done] = []
        self._undone: dict[str, Any] = {}
        self._token: Token[tuple[Noter, ...]] | None = None
        self.report: UndoReport | None = None
        """What the last ``undo()`` did."""
        self._undo_of: str | None = None
        """The workflow whose calls these are (``exactcall undo``), if not this one."""
        self._failed: dict[str, str] = {}
        self._in_doubt: dict[str, Intent] = {}
        self._nothing: dict[str, str] = {}
        """Calls whose outcome was unknown when they were made: undone once their
        reconciliation says they happened."""
        self._reports_unknown = False
        """``exactcall undo``: an undo whose outcome is unknown is reported, not awaited."""

    @property
    def calls(self) -> list[Done]:
        """The done calls noted so far, in the order they finished."""
        return list(self._calls)

    def _note(self, done: Done) -> None:
        if all(d.key != done.key for d in self._calls):  # a joined call is noted once
            self._calls.append(done)

    def _note_in_doubt(self, intent: Intent) -> None:
        if all(d.key != intent.key for d in self._calls):
            self._calls.append(done_of(intent, None))
            self._in_doubt[intent.key] = intent

    async def __aenter__(self) -> Saga:
        if not workflow.in_workflow():
            raise ExactcallError("exactcall.saga() runs inside a Temporal workflow")
        self._token = OPEN.set((*OPEN.get(), self))
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._token is not None:
            OPEN.reset(self._token)
            self._token = None
        if exc is None:
            return False
        if isinstance(exc, asyncio.CancelledError):
            # a cancelled workflow: its undos must not be cancelled in turn
            await asyncio.shield(asyncio.ensure_future(self._undo_raising(exc)))
            return False
        await self._undo_raising(exc)
        return False

    async def _undo_raising(self, cause: BaseException) -> None:
        try:
            await self.undo()
        except UndoFailed as err:
            raise err from cause

    async def undo(self) -> UndoReport:
        """Undo every done call of the block not undone yet, newest first. Every undo runs
        even when another fails; then :class:`exactcall.UndoFailed` names each failure.
        Calling it again undoes nothing twice."""
        undone: list[str] = []
        skipped: list[str] = []
        failed: dict[str, str] = {}
        nothing: dict[str, str] = {}
        reads: list[str] = []
        unknown: dict[str, str] = {}
        for i, d in enumerate(reversed(self._calls)):
            if d.step in self._undone:
                undone.append(d.step)
                continue
            if d.step in self._nothing:
                nothing[d.step] = self._nothing[d.step]
                continue
            if d.key in self._in_doubt:
                try:
                    d = await self._verdict(len(self._calls) - 1 - i, d)
                except (ToolFailed, CallAbandoned) as err:
                    # it did not happen, or nobody will ever know: nothing to undo, now or later
                    nothing[d.step] = self._nothing[d.step] = str(err)
                    continue
            try:
                t = resolve_tool(d.tool)
            except ExactcallError as err:  # exactcall undo, on a worker without the tool
                failed[d.step] = str(err)
                continue
            if t.options.read_only:  # exactcall undo of a run's calls: a read changed nothing
                reads.append(d.step)
                continue
            u = t.undo_tool
            if u is None:
                skipped.append(d.step)
                workflow.logger.warning(
                    "exactcall saga: %s (%s) has no undo declared: not undone", d.step, d.tool
                )
                continue
            try:
                self._undone[d.step] = await _undo_one(u, d, self._reports_unknown)
                undone.append(d.step)
            except asyncio.CancelledError:
                raise
            except AmbiguousOutcome as err:
                if not self._reports_unknown:
                    failed[d.step] = str(err)
                else:  # its reconciliation decides; exactcall undo lists it until then
                    unknown[d.step] = str(err)
            except Exception as err:
                failed[d.step] = (
                    str(err) if isinstance(err, ExactcallError) else f"{type(err).__name__}: {err}"
                )
        self.report = UndoReport(
            undone=undone, skipped=skipped, failed=failed, nothing_to_undo=nothing
        )
        if self._reports_unknown:  # exactcall undo's
            self.report = RunUndoReport(**dict(self.report), reads=reads, unknown=unknown)
        if failed or self._failed:
            self._publish_failures(failed)
        if failed:
            raise UndoFailed(
                "undo failed for "
                + "; ".join(f"{step} ({why})" for step, why in failed.items())
                + (f"; undone: {', '.join(undone)}" if undone else "")
                + (f"; no undo declared: {', '.join(skipped)}" if skipped else ""),
                failed=failed,
                undone=undone,
                skipped=skipped,
            )
        return self.report

    async def _verdict(self, at: int, d: Done) -> Done:
        """Wait for the reconciliation of a call whose outcome was unknown: landed (or re-run
        and done) gives the call's result; it is then undone like any done call."""
        intent = self._in_doubt[d.key]
        t = resolve_tool(d.tool)
        result = await await_verdict(t, intent, None)
        try:
            value = to_json_value(result, "result")
        except ExactcallError:
            value = None
        done = done_of(intent, value)
        self._calls[at] = done
        del self._in_doubt[d.key]
        return done

    def _publish_failures(self, failed: dict[str, str]) -> None:
        """Where ``exactcall unresolved`` finds failed undos: this workflow's memo and its
        ``ExactcallUnresolved`` search attribute (cleared once none is left)."""
        self._failed = dict(failed)  # an undo() tries every earlier failure again
        info = workflow.info()
        row = {
            "workflow_id": self._undo_of or info.workflow_id,
            "listed_by": info.workflow_id,
            "at": workflow.now().isoformat(),
            "failed": self._failed,
        }
        workflow.upsert_memo({UNDO_FAILED_MEMO: row if self._failed else None})
        workflow.upsert_search_attributes([UNRESOLVED_KEY.value_set(bool(self._failed))])


async def _undo_one(u: Tool, done: Done, raise_unknown: bool) -> Any:
    outer = OPEN.set(())  # an undo is not itself a call of the saga (or of one around it)
    try:
        on_unknown: OnUnknown | None = "raise" if raise_unknown else None
        return await call_with(u, args=[done], key=undo_step(done.step), on_unknown=on_unknown)
    finally:
        OPEN.reset(outer)


def saga() -> Saga:
    """``async with exactcall.saga() as s:``: an exception leaving the block undoes the calls
    done in it, newest first (each through its tool's ``@t.undo``), then propagates; leaving
    normally undoes nothing. ``await s.undo()`` undoes explicitly."""
    return Saga()


@workflow.defn(name=UNDO_WORKFLOW, sandboxed=False)  # pure code over exactcall's models
class UndoRun:
    """``exactcall undo WORKFLOW_ID``: undo the given done calls of a run, newest first, each
    a guarded call of the undone run (its workflow id, step ``<step>.undo``): the same key as
    the run's own saga would give it, so an undo runs once whichever process makes it, and an
    unknown outcome is reported with its reconciliation. Runs from before
    UNDO_KEYS_OF_THE_RUN made each undo as a call of this workflow's own id."""

    @workflow.run
    async def run(self, inp: UndoInput) -> UndoReport:  # RunUndoReport since the patch
        s = Saga()
        s._calls = list(inp.calls)
        s._undo_of = inp.workflow_id
        if workflow.patched(UNDO_KEYS_OF_THE_RUN):
            state().calls_of = inp.workflow_id
            s._reports_unknown = True
        try:
            return await s.undo()
        except UndoFailed:
            assert s.report is not None
            return s.report
