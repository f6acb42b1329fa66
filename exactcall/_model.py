"""Frozen models that cross Temporal boundaries: the intent and the per-key call record.

Pure and deterministic: imported by workflows and activities alike. The record reducer
(:meth:`RecordState.apply`) is shared by the record workflow and by activities that read a
record's history, so both always agree on what a record says.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from exactcall._canonical import derive_key

__all__ = [
    "FROZEN",
    "ApprovalGrant",
    "CallIdentity",
    "Intent",
    "Owner",
    "RecordEvent",
    "RecordInit",
    "RecordState",
    "WireIntent",
    "intent_from_input",
]

FROZEN = ConfigDict(frozen=True, extra="forbid")
"""exactcall's models: immutable, and an unknown field is an error (not dropped)."""


class CallIdentity(BaseModel):
    """Which call a record is of: the fields every listing of one call starts with (a pending
    approval, a parked call), in this order, so that they serialize as they always have."""

    model_config = FROZEN

    workflow_id: str
    step: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    key: str


class ApprovalGrant(BaseModel):
    """The approval a call runs under (carried in the intent, checked at the effect)."""

    model_config = FROZEN

    args_hash: str
    approved_by: tuple[str, ...]
    reasons: tuple[str, ...] = ()
    decided_at: datetime


class Intent(BaseModel):
    """What one tool call is about to do, persisted (as the activity input) before any attempt.

    ``args`` are the canonical arguments, every parameter by name with defaults applied;
    ``args_hash`` is ``exactcall.intent_hash`` of the call; ``key`` is the derived
    idempotency key handed to the provider.
    """

    model_config = FROZEN

    tool: str
    tool_version: str
    args: dict[str, Any]
    args_hash: str
    namespace: str
    workflow_id: str
    workflow_type: str
    step: str
    key: str
    explicit_key: bool = False
    record_task_queue: str
    """Task queue of the calling workflow: exactcall's own workflows run there."""
    approval: ApprovalGrant | None = None
    """The approval this call runs under, when it needed one (checked again at the effect)."""

    def wire(self, task_queue: str) -> WireIntent:
        """This intent as the tool activity's input (written to history before any attempt):
        without what the attempt and every reader of the history know from where it is (the
        workflow type, the calling workflow's task queue when the activity is scheduled on it)
        or can derive (the key)."""
        own_queue = self.record_task_queue
        fields = {**dict(self), "workflow_type": None, "key": None}
        fields["record_task_queue"] = None if own_queue == task_queue else own_queue
        return WireIntent(**fields)


def intent_from_input(value: Any, *, workflow_type: str, task_queue: str) -> Intent:
    """The Intent a tool activity's input (decoded, in either form) says: for readers of a
    history (the scheduled event's task queue, the run's workflow type)."""
    return WireIntent.model_validate(value).complete(
        workflow_type=workflow_type, task_queue=task_queue
    )


class WireIntent(BaseModel):
    """An :class:`Intent` as the tool activity's input. Inputs written by exactcall before
    this form carry every field of an Intent, and read the same: what is set is used, what is
    not comes from where the input is read (:meth:`complete`)."""

    model_config = FROZEN

    tool: str
    tool_version: str
    args: dict[str, Any]
    args_hash: str
    namespace: str
    workflow_id: str
    step: str
    explicit_key: bool = False
    record_task_queue: str | None = None
    """Left out when it is the task queue the activity was scheduled on."""
    approval: ApprovalGrant | None = None
    workflow_type: str | None = None
    """Left out: the scheduling workflow's type (its attempt's info, its history's start)."""
    key: str | None = None
    """Left out: :func:`~exactcall._canonical.derive_key` of the rest."""

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if v is not None and (k != "explicit_key" or v)}

    def complete(self, *, workflow_type: str, task_queue: str) -> Intent:
        """The Intent, with what the input leaves out taken from where it is read: the type
        of the workflow that scheduled it, and the task queue the activity was scheduled on."""
        key = self.key or derive_key(
            self.namespace, self.workflow_id, self.step, self.tool, self.tool_version
        )
        return Intent(
            **{
                **dict(self),
                "workflow_type": self.workflow_type or workflow_type,
                "key": key,
                "record_task_queue": self.record_task_queue or task_queue,
            }
        )


class Owner(BaseModel):
    """One attempt chain: an activity of one workflow run."""

    model_config = FROZEN

    run_id: str
    activity_id: str


Phase = Literal["calling", "idle", "done", "unknown", "abandoned"]


class RecordEvent(BaseModel):
    """A marker written to a call record (as a signal) by an attempt."""

    model_config = FROZEN

    kind: Literal["calling", "released", "done", "unknown", "not_landed", "abandoned"]
    owner: Owner
    attempt: int
    result: Any = None
    unserializable: str | None = None
    reason: str | None = None


class RecordInit(BaseModel):
    """Input of a call record: written by the first attempt right before it calls the tool.

    A record that closed (its lifetime is short, and it closes without running any code) is
    opened again, as a new run under the same workflow id, when a marker comes later: that
    run starts from ``state``, the state so far, and ``since``, when the key was first claimed.
    """

    model_config = FROZEN

    intent: Intent
    owner: Owner
    attempt: int
    state: RecordState | None = None
    since: datetime | None = None


class RecordState(BaseModel):
    """What is known about one key: who may have called the tool, and the outcome."""

    model_config = FROZEN

    intent: Intent
    phase: Phase
    owner: Owner
    result: Any = None
    unserializable: str | None = None
    reason: str | None = None

    @classmethod
    def start(cls, init: RecordInit) -> RecordState:
        if init.state is not None:  # a record opened again: it goes on from there
            return init.state
        return cls(intent=init.intent, phase="calling", owner=init.owner)

    @property
    def final(self) -> bool:
        return self.phase in ("done", "abandoned")

    def apply(self, ev: RecordEvent) -> RecordState:
        """The state after ``ev``. ``done`` and ``abandoned`` are final."""
        if self.final:
            return self
        if ev.kind == "abandoned":
            return self.model_copy(update={"phase": "abandoned", "reason": ev.reason})
        if ev.kind == "not_landed":  # a reconciliation verdict: it did not happen
            return self.model_copy(update={"phase": "idle", "owner": ev.owner, "reason": ev.reason})
        if ev.kind == "done":
            return self.model_copy(
                update={
                    "phase": "done",
                    "owner": ev.owner,
                    "result": ev.result,
                    "unserializable": ev.unserializable,
                    "reason": None,
                }
            )
        if ev.kind == "calling":
            return self.model_copy(update={"phase": "calling", "owner": ev.owner, "reason": None})
        if ev.kind == "released":
            if self.phase == "calling" and self.owner == ev.owner:
                return self.model_copy(update={"phase": "idle", "reason": ev.reason})
            return self
        return self.model_copy(update={"phase": "unknown", "reason": ev.reason})


RecordInit.model_rebuild()
