"""exactcall's own workflows (installed as ``exactcall.workflows``)."""

from exactcall.workflows._budget import BudgetLedger
from exactcall.workflows._reconciliation import PROBE_PREFIX, Reconcile, probe_activity_name
from exactcall.workflows._record import (
    MARK_RECORD,
    MARK_SIGNAL,
    RECORD_STATE_QUERY,
    RECORD_WORKFLOW,
    CallRecord,
    record_id,
)
from exactcall.workflows._saga import UndoRun

__all__ = [
    "MARK_RECORD",
    "MARK_SIGNAL",
    "PROBE_PREFIX",
    "RECORD_STATE_QUERY",
    "RECORD_WORKFLOW",
    "BudgetLedger",
    "CallRecord",
    "Reconcile",
    "UndoRun",
    "probe_activity_name",
    "record_id",
]
