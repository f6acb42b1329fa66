"""exactcall's own workflows (installed as ``exactcall.workflows``)."""

from exactcall.workflows._budget import BudgetLedger
from exactcall.workflows._reconciliation import PROBE_PREFIX, Reconcile, probe_activity_name
from exactcall.workflows._record import (
    MARK_RECORD,
    MARK_SIGNAL,
    RECORD_WORKFLOW,
    STATE_QUERY,
    CallRecord,
    record_id,
)
from exactcall.workflows._saga import UndoRun

__all__ = [
    "MARK_RECORD",
    "MARK_SIGNAL",
    "PROBE_PREFIX",
    "RECORD_WORKFLOW",
    "STATE_QUERY",
    "BudgetLedger",
    "CallRecord",
    "Reconcile",
    "UndoRun",
    "probe_activity_name",
    "record_id",
]
