"""Budgets: a bound across calls (``exactcall.Budget``), and the models of its ledger.

A budget is reserved before a call's tool runs (and before it waits for its own approval), in
a ledger that is a Temporal workflow of exactcall's: one per budget for ``scope="namespace"``,
one per budget and workflow id for ``scope="workflow"``. Reservations are Updates, so
concurrent calls on many workers are ordered by the ledger; one that would pass the limit is
refused by the Update's validator (no history) and then, by default, waits for a person.
A reservation is keyed by the call's key, so a retried attempt, a replay, a reset or a re-run
of the same call reserves once.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from exactcall._errors import ExactcallError, InvalidCall, register_error
from exactcall._wire import BUDGET_MEMO, BUDGET_WORKFLOW, budget_id

if TYPE_CHECKING:
    from exactcall._model import Intent

__all__ = [
    "BatchAnswer",
    "Budget",
    "BudgetExceeded",
    "BudgetView",
    "Charge",
    "ChargeAnswer",
    "ChargeBatch",
    "ChargeOp",
    "LedgerInput",
    "charge_op",
    "ledger_input",
    "ledgers",
    "settle_charges",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Measure = str | Callable[[Mapping[str, Any]], Any] | None


@dataclass(frozen=True, eq=False)
class Budget:
    """A bound on what a tool's calls may spend, together, before a person says yes.

    ``limit``: what may be spent (reserved, then kept) in a window. ``measure``: None counts
    each call as 1; a string names the argument whose number is spent; a callable takes the
    canonical args and returns the number (it runs in the workflow: keep it deterministic).
    ``per``: the window, fixed windows in UTC counted from the epoch (a day is a UTC day);
    None: one window for ever. ``scope``: ``"namespace"`` (shared by every workflow of the
    namespace, on every worker) or ``"workflow"`` (per workflow id, across its runs).
    ``on_exceed``: ``"approval"`` (the call waits for a person, bound to its argument hash) or
    ``"refuse"`` (``BudgetExceeded``, nothing runs).
    """

    name: str
    limit: float
    per: timedelta | None = None
    measure: Measure = None
    scope: Literal["namespace", "workflow"] = "namespace"
    on_exceed: Literal["approval", "refuse"] = "approval"

    def __init__(
        self,
        name: str,
        *,
        limit: float,
        per: timedelta | None = None,
        measure: Measure = None,
        scope: Literal["namespace", "workflow"] = "namespace",
        on_exceed: Literal["approval", "refuse"] = "approval",
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TypeError(
                f"exactcall.Budget({name!r}): a name of letters, digits, '.', '_' and '-' "
                "(up to 100), starting with a letter or digit"
            )
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit >= 0:
            raise TypeError(f"exactcall.Budget({name!r}, limit={limit!r}): a number >= 0")
        if not math.isfinite(limit):
            raise TypeError(f"exactcall.Budget({name!r}, limit={limit!r}): a finite number")
        if per is not None and (not isinstance(per, timedelta) or per <= timedelta(0)):
            raise TypeError(f"exactcall.Budget({name!r}, per={per!r}): a positive timedelta")
        if measure is not None and not (isinstance(measure, str) or callable(measure)):
            raise TypeError(
                f"exactcall.Budget({name!r}, measure={measure!r}): None (count calls), an "
                "argument's name, or a function of the canonical args"
            )
        if scope not in ("namespace", "workflow"):
            raise TypeError(
                f"exactcall.Budget({name!r}, scope={scope!r}): 'namespace' or 'workflow'"
            )
        if on_exceed not in ("approval", "refuse"):
            raise TypeError(
                f"exactcall.Budget({name!r}, on_exceed={on_exceed!r}): 'approval' or 'refuse'"
            )
        for k, v in (
            ("name", name),
            ("limit", limit),
            ("per", per),
            ("measure", measure),
            ("scope", scope),
            ("on_exceed", on_exceed),
        ):
            object.__setattr__(self, k, v)

    def __repr__(self) -> str:
        per = f", per={self.per}" if self.per else ""
        return f"Budget({self.name!r}, limit={self.limit}{per}, scope={self.scope!r})"

    def measure_of(self, tool: str, args: Mapping[str, Any]) -> float:
        """What one call spends: a non-negative finite number, or ``InvalidCall``."""
        m = self.measure
        if m is None:
            value: Any = 1
        elif isinstance(m, str):
            if m not in args:
                raise InvalidCall(
                    f"budget {self.name!r} measures argument {m!r}, which {tool} does not "
                    f"have (its arguments: {', '.join(sorted(args))}); nothing ran",
                    tool=tool,
                    budget=self.name,
                )
            value = args[m]
        else:
            try:
                value = m(args)
            except Exception as exc:
                raise InvalidCall(
                    f"budget {self.name!r}: its measure raised {type(exc).__name__}: {exc}; "
                    "nothing ran",
                    tool=tool,
                    budget=self.name,
                ) from None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InvalidCall(
                f"budget {self.name!r}: the measure of this {tool} call is {value!r}, not a "
                "non-negative number; nothing ran",
                tool=tool,
                budget=self.name,
                measure=repr(value),
            )
        return float(value)

    def window_of(self, now: datetime) -> str:
        """The window a call made at ``now`` falls in: its start in UTC (ISO), or ``all``."""
        if self.per is None:
            return "all"
        step = self.per.total_seconds()
        start = math.floor((now - _EPOCH).total_seconds() / step) * step
        return (_EPOCH + timedelta(seconds=start)).isoformat().replace("+00:00", "Z")

    def ledger_id(self, workflow_id: str) -> str:
        return budget_id(self.name, workflow_id if self.scope == "workflow" else None)


@register_error
class BudgetExceeded(ExactcallError):
    """The call would pass a budget declared ``on_exceed="refuse"``: nothing ran."""

    code = "BudgetExceeded"


# -- the ledger's models (the wire of its Updates and query) ---------------------------------
_LEDGER_WIRE = ConfigDict(frozen=True, extra="ignore")
"""Immutable; a field this version does not know is dropped (a ledger and its callers may be
of different versions)."""


class Charge(BaseModel):
    """One call's charge on a budget."""

    model_config = _LEDGER_WIRE

    key: str
    workflow_id: str
    step: str
    tool: str
    measure: float
    window: str
    state: Literal["reserved", "spent", "released"]
    overrun: bool = False
    approved_by: tuple[str, ...] = ()
    at: datetime
    allowance: bool = False
    """Not a call's: budget held by one run for its next calls (their charges are taken out
    of it as they are reported; what is left is released when the run's code ends)."""
    lease: str = ""
    """The run's allowance this call was drawn from (its report is then idempotent)."""
    drawn: float = 0.0
    """Of an allowance: what the run's reported calls took out of it."""


class ChargeOp(BaseModel):
    """What a call asks of a ledger (through the ``exactcall.budget`` local activity)."""

    model_config = _LEDGER_WIRE

    op: Literal["reserve", "spend", "release"]
    ledger_id: str
    budget: str
    limit: float
    per_seconds: float | None
    scope: str
    task_queue: str
    key: str
    workflow_id: str = ""
    step: str = ""
    tool: str = ""
    measure: float = 0.0
    window: str = "all"
    overrun_approved_by: tuple[str, ...] | None = None
    """A person's yes to passing the limit: the reservation is made whatever is left."""
    settles: tuple[ChargeOp, ...] = ()
    """Spends of the run's earlier done calls, carried by this operation (sent to their
    ledgers before it; each is idempotent by its key)."""
    allowance: float = 0.0
    """A reservation's ask for more, held by the run (key ``lease``) for its next calls."""
    lease: str = ""
    """The allowance a call's units were drawn from: a spend or reserve of the call's key
    takes them out of it (a call charged before is not charged again: they are released);
    a release whose key is ``lease`` releases what is left of it."""


def charge_op(b: Budget, intent: Intent, measure: float, window: str) -> ChargeOp:
    """The reservation of ``measure`` by ``intent``'s call on ``b``'s ledger, in ``window``."""
    return ChargeOp(
        op="reserve",
        ledger_id=b.ledger_id(intent.workflow_id),
        budget=b.name,
        limit=float(b.limit),
        per_seconds=b.per.total_seconds() if b.per else None,
        scope=b.scope,
        task_queue=intent.record_task_queue,
        key=intent.key,
        workflow_id=intent.workflow_id,
        step=intent.step,
        tool=intent.tool,
        measure=measure,
        window=window,
    )


def settle_charges(budgets: Sequence[Budget], intent: Intent) -> tuple[ChargeOp, ...]:
    """What settles every reservation of ``intent``'s call (by key, in any window): one op per
    budget, made "spend" or "release" once the outcome is known."""
    return tuple(charge_op(b, intent, 0.0, "all") for b in budgets)


class ChargeAnswer(BaseModel):
    model_config = _LEDGER_WIRE

    ok: bool
    """Reserved (or settled); False: over the limit, nothing reserved."""
    state: str = ""
    spent: float = 0.0
    reserved: float = 0.0
    limit: float = 0.0
    window: str = "all"
    allowance: float = 0.0
    """What the ledger granted of the reservation's ask (under ``lease``)."""
    lease: str = ""
    """The allowance's key (what a replay of the run, or a reset run, draws from)."""


class ChargeBatch(BaseModel):
    """One process's operations on one ledger, in the order they are applied."""

    model_config = _LEDGER_WIRE

    ops: list[ChargeOp]


class BatchAnswer(BaseModel):
    model_config = _LEDGER_WIRE

    answers: list[ChargeAnswer]
    """One per operation of the batch, in its order."""


class LedgerInput(BaseModel):
    model_config = _LEDGER_WIRE

    budget: str
    scope: str
    limit: float
    per_seconds: float | None
    charges: list[Charge] = []
    pruned: dict[str, dict[str, float]] = {}
    """Totals of charges summarised when the ledger continued as new (spent, calls,
    overruns), by window."""
    spent_keys: dict[str, list[str]] = {}
    """The keys (first ``KEY_PREFIX`` hex digits) of the summarised spent charges of windows
    still open, by window: the same call reserved again (a reset, a re-run of its workflow
    id) is charged once. A closed window's keys are dropped ``IDLE`` after it ends."""
    max_events: int = 2_000
    """Continue as new past this many events (and when Temporal suggests it)."""
    early: dict[str, str] = {}
    """Settles that came before their call's charge (a call drawn from a run's allowance whose
    reconciliation settled it before the run reported the call): key -> spend or release, the
    call's outcome when its charge comes."""


KEY_PREFIX = 32
"""Hex digits of a summarised charge's key kept by the ledger (128 bits: no collision)."""


class WindowTotals(BaseModel):
    model_config = _LEDGER_WIRE

    window: str
    spent: float
    reserved: float
    limit: float
    calls: int
    overruns: int


class BudgetView(BaseModel):
    """Answer of the ledger's query: each window's totals, and (on request) its charges."""

    model_config = _LEDGER_WIRE

    budget: str
    scope: str
    limit: float
    per_seconds: float | None
    windows: list[WindowTotals]
    charges: list[Charge] = []


def ledger_input(op: ChargeOp) -> LedgerInput:
    """A new ledger's input, from its first call's operation."""
    return LedgerInput(budget=op.budget, scope=op.scope, limit=op.limit, per_seconds=op.per_seconds)


def window_end(window: str, per_seconds: float | None) -> datetime | None:
    if window == "all" or per_seconds is None:
        return None
    return datetime.fromisoformat(window.replace("Z", "+00:00")) + timedelta(seconds=per_seconds)


def totals(
    charges: list[Charge], limit: float, pruned: Mapping[str, Mapping[str, float]]
) -> list[WindowTotals]:
    out: dict[str, dict[str, float]] = {}
    for w, t in pruned.items():
        out[w] = {
            "spent": t.get("spent", 0.0),
            "reserved": 0.0,
            "calls": t.get("calls", 0.0),
            "overruns": t.get("overruns", 0.0),
        }
    for c in charges:
        t = out.setdefault(c.window, {"spent": 0.0, "reserved": 0.0, "calls": 0.0, "overruns": 0.0})
        if c.state == "spent":
            t["spent"] += c.measure
        elif c.state == "reserved":
            t["reserved"] += c.measure
        if c.state != "released":
            t["calls"] += 1
            t["overruns"] += c.overrun
    return [
        WindowTotals(
            window=w,
            spent=t["spent"],
            reserved=t["reserved"],
            limit=limit,
            calls=int(t["calls"]),
            overruns=int(t["overruns"]),
        )
        for w, t in sorted(out.items())
    ]


def over_text(b: Budget, window: str, a: ChargeAnswer, measure: float) -> str:
    """The reason a person reads: which budget, which window, spent, this call, the limit."""
    w = "" if window == "all" else f" (window from {window})"
    held = f", {_n(a.reserved)} reserved" if a.reserved else ""
    return (
        f"budget {b.name}{w}: {_n(a.spent)} spent{held}, this call {_n(measure)}, "
        f"limit {_n(a.limit)}"
    )


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


async def ledgers(client: Client) -> AsyncIterator[tuple[str, BudgetView]]:
    """Each running budget ledger of the namespace: (its workflow id, its totals), read from
    the ledger's memo (no worker needed). Visibility finds the ledgers; the memo is read by
    describe, from the ledger itself: visibility's copy can lag, or keep an older update
    that arrived last, for as long as the ledger changes nothing more."""
    query = f"WorkflowType = '{BUDGET_WORKFLOW}' AND ExecutionStatus = 'Running'"
    seen: set[str] = set()
    async for wf in client.list_workflows(query):
        if wf.id in seen:  # (a run that continued as new, and the next one)
            continue
        seen.add(wf.id)
        try:  # its latest run
            desc = await client.get_workflow_handle(wf.id).describe()
            memo = await desc.memo()
        except RPCError:
            continue
        if desc.status != WorkflowExecutionStatus.RUNNING:
            continue
        totals = memo.get(BUDGET_MEMO)
        if isinstance(totals, dict):
            yield wf.id, BudgetView.model_validate(totals)
