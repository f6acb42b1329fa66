"""The saga's stage of the call path: each call that ends done (or in doubt) is noted for
every ``exactcall.saga()`` block open around it (a ContextVar: the block's task and the tasks
started from it). The call path imports this module; the saga (``_saga``) imports the call
path to make its undos.
"""

from __future__ import annotations

import contextvars
from typing import Any, Protocol

from exactcall._canonical import to_json_value
from exactcall._errors import ExactcallError
from exactcall._model import Intent
from exactcall.undo._undo import Done

__all__ = ["OPEN", "Noter", "done_of", "note_done", "note_in_doubt"]


class Noter(Protocol):
    def _note(self, done: Done) -> None: ...
    def _note_in_doubt(self, intent: Intent) -> None: ...


OPEN: contextvars.ContextVar[tuple[Noter, ...]] = contextvars.ContextVar(
    "exactcall_sagas", default=()
)
"""The saga blocks open around the running code, innermost last."""


def note_in_doubt(intent: Intent) -> None:
    """A call raised AmbiguousOutcome (``on_unknown="raise"``): its reconciliation goes on,
    and a saga that undoes waits for its verdict first."""
    for s in OPEN.get():
        s._note_in_doubt(intent)


def note_done(intent: Intent, result: Any) -> None:
    """A call finished done: each saga open around it may have to undo it."""
    sagas = OPEN.get()
    if not sagas:
        return
    try:
        value = to_json_value(result, "result")
    except ExactcallError:
        value = None  # not JSON: the undo gets the arguments only
    done = done_of(intent, value)
    for s in sagas:
        s._note(done)


def done_of(intent: Intent, result: Any) -> Done:
    return Done(
        tool=intent.tool,
        step=intent.step,
        key=intent.key,
        args=intent.args,
        result=result,
        workflow_id=intent.workflow_id,
    )
