"""Reconciliation of calls whose outcome is unknown: verdicts, resolutions, settlements.

Pure models, shared by the agent side, the reconciliation workflow, the probe activity and
the CLI. A probe answers ``Landed(result)``, ``NotLanded()`` or ``Unknown(reason)``; a person
answers ``landed`` (with a result), ``not_landed`` or ``abandon``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel
from temporalio.common import WorkflowIDReusePolicy

from exactcall._errors import ExactcallError, register_error
from exactcall._model import FROZEN, CallIdentity, Intent
from exactcall._ui import call_summary, intent_details
from exactcall._wire import CANCELLED_MEMO, RECONCILE_STATE_QUERY
from exactcall._wire import JOINED_SIGNAL as JOINED_SIGNAL
from exactcall._wire import RECONCILE_WORKFLOW as RECONCILE_WORKFLOW
from exactcall._wire import RESOLVE_SIGNAL as RESOLVE_SIGNAL
from exactcall._wire import SETTLED_SIGNAL as SETTLED_SIGNAL
from exactcall._wire import UNRESOLVED_ATTRIBUTE as UNRESOLVED_ATTRIBUTE
from exactcall._wire import UNRESOLVED_MEMO as UNRESOLVED_MEMO
from exactcall._wire import VERDICT_MEMO as VERDICT_MEMO
from exactcall._wire import reconcile_id as reconcile_id
from exactcall.budgets._budget import ChargeOp, settle_charges

if TYPE_CHECKING:
    from exactcall._tool import Tool

__all__ = [
    "JOINED_SIGNAL",
    "RECONCILE_STATE_QUERY",
    "RECONCILE_WORKFLOW",
    "RESOLVE_SIGNAL",
    "SETTLED_SIGNAL",
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

    model_config = FROZEN

    kind: Literal["landed", "not_landed", "unknown"]
    result: Any = None
    reason: str | None = None


def to_verdict(answer: Any) -> Verdict:
    if isinstance(answer, Landed):
        from exactcall._canonical import to_json_value

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

    model_config = FROZEN

    verdict: Literal["landed", "not_landed", "abandon"]
    result: Any = None
    by: str
    reason: str | None = None
    resolution_id: str | None = None


class CallSpec(BaseModel):
    """How the call's tool activity is scheduled: carried in the reconciliation's input, so a
    re-run and the probe are scheduled from history, never from which tools a worker imported.
    """

    model_config = FROZEN

    task_queue: str | None
    start_to_close_timeout: timedelta
    heartbeat_timeout: timedelta
    backoff_coefficient: float
    maximum_interval: timedelta | None
    late_commit: timedelta = timedelta(0)
    """The tool's ``late_commit``: how long its provider may still commit a request the tool
    gave up on (absent from inputs of older versions: 0)."""


class ReconcileInput(BaseModel):
    model_config = FROZEN

    intent: Intent
    reason: str
    since: datetime
    has_probe: bool
    probe_deadline: timedelta
    call: CallSpec | None = None
    """None in reconciliations started before exactcall carried it (they look the tool up)."""
    budget_charges: tuple[ChargeOp, ...] | None = None
    """What settles the call's budget reservations once the verdict is known (empty: a tool
    without budgets). None in reconciliations started before exactcall carried it (they look
    the tool up in the replaying worker's registry)."""


class UnresolvedCall(CallIdentity):
    """A parked call, as listed by ``exactcall unresolved``."""

    since: datetime
    reason: str
    reconcile_id: str


class Settled(BaseModel):
    """How a reconciliation ended: the result of the reconciliation workflow."""

    model_config = FROZEN

    outcome: Literal["done", "failed", "abandoned"]
    verdict: Literal["landed", "not_landed", "abandon"]
    decided_by: str
    result: Any = None
    reason: str | None = None
    error_type: str | None = None


class SettledNote(BaseModel):
    """Payload of ``exactcall.settled``: the verdict on one key."""

    model_config = FROZEN

    key: str
    settled: Settled


class ReconcileState(BaseModel):
    """Answer of the reconciliation workflow's query."""

    model_config = FROZEN

    phase: Literal["probing", "parked", "re-running", "settled"]
    reason: str
    history: list[str]
    resolutions: list[tuple[Resolution, str]]
    settled: Settled | None = None


# -- how a reconciliation is started (by the workflow of the call, or by its attempt) ------
RECONCILE_TASK_TIMEOUT = timedelta(seconds=2)
"""A reconciliation's workflow task held by a worker that died is retried after this, not
after Temporal's 10 s default (as the call record's)."""


def call_spec(t: Tool) -> CallSpec:
    """How ``t``'s activity is scheduled (what a reconciliation carries in its input)."""
    opts = t.options
    p = opts.retry_policy
    return CallSpec(
        task_queue=opts.task_queue,
        start_to_close_timeout=opts.start_to_close_timeout,
        heartbeat_timeout=opts.heartbeat_timeout,
        backoff_coefficient=p.backoff_coefficient,
        maximum_interval=p.maximum_interval,
        late_commit=opts.late_commit,
    )


def reconcile_input(t: Tool, intent: Intent, reason: str, since: datetime) -> ReconcileInput:
    """What the reconciliation of ``intent`` needs, all of it in its input."""
    return ReconcileInput(
        intent=intent,
        reason=reason,
        since=since,
        has_probe=t.options.reconcile is not None,
        probe_deadline=t.options.reconcile_deadline,
        call=call_spec(t),
        budget_charges=settle_charges(t.options.budgets, intent),
    )


def reconcile_start_options(inp: ReconcileInput, *, cancelled: bool) -> dict[str, Any]:
    """Start options of a reconciliation, the same whether the workflow of the call starts it
    (as a child) or the attempt that found the outcome unknown does (from its client)."""
    intent = inp.intent
    return {
        "id": reconcile_id(intent.key),
        "task_queue": intent.record_task_queue,
        "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
        "task_timeout": RECONCILE_TASK_TIMEOUT,
        "static_summary": call_summary(intent, "reconcile "),
        "static_details": intent_details(intent, "Reconciliation", [f"- **why** {inp.reason}"]),
        "memo": {CANCELLED_MEMO: True} if cancelled else None,
    }
