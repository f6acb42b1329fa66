"""Undo: ``@t.undo`` declares a tool's compensation, ``exactcall.Done`` is what it is given,
``UndoFailed`` says which undos did not succeed. The workflow side is ``workflows/_saga.py``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from exactcall._errors import ExactcallError, register_error

__all__ = [
    "UNDO_SUFFIX",
    "Done",
    "RunUndoReport",
    "UndoFailed",
    "UndoInput",
    "UndoReport",
    "is_undo_step",
    "undo_step",
]

UNDO_SUFFIX = ".undo"
"""An undo tool's default name is its tool's name plus this; its step is the undone step's."""


def undo_step(step: str) -> str:
    """The step of the undo of ``step``: its key derives from it (workflow id, this step, the
    undo tool and its version), so an undo runs once across crashes, retries and re-runs."""
    return step + UNDO_SUFFIX


def is_undo_step(step: str) -> bool:
    """Whether ``step`` is the undo of another step."""
    return step.endswith(UNDO_SUFFIX)


class Done(BaseModel):
    """A call that is done, handed to its tool's undo."""

    model_config = ConfigDict(frozen=True)

    tool: str
    step: str
    key: str
    args: dict[str, JsonValue]
    result: JsonValue = None
    workflow_id: str


class UndoReport(BaseModel):
    """What ``Saga.undo()`` did, newest call first."""

    model_config = ConfigDict(frozen=True)

    undone: list[str] = []
    """Steps whose undo is done (now or by an earlier undo of the same saga)."""
    skipped: list[str] = []
    """Steps whose tool declares no undo."""
    failed: dict[str, str] = {}
    """Steps whose undo failed, with the error."""
    nothing_to_undo: dict[str, str] = {}
    """Steps whose outcome was unknown and turned out not to have happened (or was
    abandoned), with why."""


class RunUndoReport(UndoReport):
    """What ``exactcall undo`` did of a run's calls (its undo workflow's result)."""

    reads: list[str] = []
    """Steps of read-only tools: they changed nothing."""
    unknown: dict[str, str] = {}
    """Steps whose undo's outcome is unknown, with why: its reconciliation decides (reported,
    not waited for; a saga waits for the verdict)."""


class UndoInput(BaseModel):
    """What ``exactcall undo`` asks its workflow to undo: the done calls of one run, in the
    order they finished (undone newest first)."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    calls: list[Done]


@register_error
class UndoFailed(ExactcallError):
    """One or more undos of a saga failed (every other undo still ran): ``failed`` maps each
    such step to its error; ``undone`` and ``skipped`` list the rest."""

    code = "UndoFailed"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message, **fields)
