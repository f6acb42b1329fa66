"""Reconciliation of calls whose outcome is unknown: verdicts, resolutions, settlements.

Pure models, shared by the agent side, the reconciliation workflow, the probe activity and
the CLI. A probe answers ``Landed(result)``, ``NotLanded()`` or ``Unknown(reason)``; a person
answers ``landed`` (with a result), ``not_landed`` or ``abandon``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ._errors import ExactcallError, register_error
from ._model import Intent

__all__ = [
    "JOINED_SIGNAL",
    "RECONCILE_WORKFLOW",
    "RESOLVE_SIGNAL",
    "SETTLED_SIGNAL",
    "STATE_QUERY",
    "UNRESOLVED_ATTRIBUTE",
    "UNRESOLVED_MEMO",
    "CallAbandoned",
    "CallSpec",
    "Landed",
    "NotLanded",
    "ReconcileInput",
    "ReconcileState",
    "Resolution",
    "Settled",
    "SettledNote",
    "Unknown",
    "UnresolvedCall",
    "Verdict",
    "reconcile_id",
    "to_verdict",
]

RECONCILE_WORKFLOW = "exactcall.Reconcile"
RESOLVE_SIGNAL = "exactcall.resolve"
SETTLED_SIGNAL = "exactcall.settled"
"""To the call's workflow, from a reconciliation that is not its child: the verdict."""
JOINED_SIGNAL = "exactcall.joined"
"""To a reconciliation, from the call's workflow joining it: accepted only while it runs."""
STATE_QUERY = "exactcall.reconcile_state"
UNRESOLVED_MEMO = "exactcall.unresolved"
VERDICT_MEMO = "exactcall.verdict"
UNRESOLVED_ATTRIBUTE = "ExactcallUnresolved"

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def reconcile_id(key: str) -> str:
    """Workflow id of the reconciliation of ``key``."""
    return f"exactcall-reconcile-{key}"


@register_error
class CallAbandoned(ExactcallError):
    """A person gave up on a call whose outcome was unknown; the agent decides what next."""

    code = "CallAbandoned"


class Landed:
    """The probe found the effect at the destination; ``result`` becomes the call's result."""

    def __init__(self, result: Any = None) -> None:
        self.result = result

    def __repr__(self) -> str:
        return f"Landed({self.result!r})"


class NotLanded:
    """The probe is sure the effect did not happen: the call runs once more, same key."""

    def __repr__(self) -> str:
        return "NotLanded()"


class Unknown:
    """The probe cannot tell: the call is parked for a person."""

    def __init__(self, reason: str = "the probe could not tell") -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unknown({self.reason!r})"


class Verdict(BaseModel):
    """A probe's answer, as it crosses the activity boundary."""

    model_config = _FROZEN

    kind: Literal["landed", "not_landed", "unknown"]
    result: Any = None
    reason: str | None = None


def to_verdict(answer: Any) -> Verdict:
    if isinstance(answer, Landed):
        from ._canonical import to_json_value

        return Verdict(kind="landed", result=to_json_value(answer.result, "Landed result"))
    if isinstance(answer, NotLanded):
        return Verdict(kind="not_landed")
    if isinstance(answer, Unknown):
        return Verdict(kind="unknown", reason=answer.reason)
    raise TypeError(
        f"a reconcile probe must return Landed(result), NotLanded() or Unknown(reason), "
        f"not {answer!r}"
    )


class Resolution(BaseModel):
    """Payload of the ``exactcall.resolve`` signal: a person's verdict."""

    model_config = _FROZEN

    verdict: Literal["landed", "not_landed", "abandon"]
    result: Any = None
    by: str
    reason: str | None = None
    resolution_id: str | None = None


class CallSpec(BaseModel):
    """How the call's tool activity is scheduled: carried in the reconciliation's input, so a
    re-run and the probe are scheduled from history, never from which tools a worker imported.
    """

    model_config = _FROZEN

    task_queue: str | None
    start_to_close_timeout: timedelta
    heartbeat_timeout: timedelta
    backoff_coefficient: float
    maximum_interval: timedelta | None


class ReconcileInput(BaseModel):
    model_config = _FROZEN

    intent: Intent
    reason: str
    since: datetime
    has_probe: bool
    probe_deadline: timedelta
    call: CallSpec | None = None
    """None in reconciliations started before exactcall carried it (they look the tool up)."""


class UnresolvedCall(BaseModel):
    """A parked call, as listed by ``exactcall unresolved``."""

    model_config = _FROZEN

    workflow_id: str
    step: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    key: str
    since: datetime
    reason: str
    reconcile_id: str


class Settled(BaseModel):
    """How a reconciliation ended: the result of the reconciliation workflow."""

    model_config = _FROZEN

    outcome: Literal["done", "failed", "abandoned"]
    verdict: Literal["landed", "not_landed", "abandon"]
    decided_by: str
    result: Any = None
    reason: str | None = None
    error_type: str | None = None


class SettledNote(BaseModel):
    """Payload of ``exactcall.settled``: the verdict on one key."""

    model_config = _FROZEN

    key: str
    settled: Settled


class ReconcileState(BaseModel):
    """Answer of the reconciliation workflow's query."""

    model_config = _FROZEN

    phase: Literal["probing", "parked", "re-running", "settled"]
    reason: str
    history: list[str]
    resolutions: list[tuple[Resolution, str]]
    settled: Settled | None = None
