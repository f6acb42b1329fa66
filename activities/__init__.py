"""exactcall's activities (installed as ``exactcall.activities``): the tool activity that runs
one attempt of a call, and client-side access to call records."""

from exactcall.activities._budget import budget_charge
from exactcall.activities._probe import await_settled, mark_record, probe_activity
from exactcall.activities._records import Record, RecordView
from exactcall.activities._runner import tool_activity

__all__ = [
    "Record",
    "RecordView",
    "await_settled",
    "budget_charge",
    "mark_record",
    "probe_activity",
    "tool_activity",
]
