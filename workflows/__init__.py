"""exactcall's own workflows (installed as ``exactcall.workflows``)."""

from ._record import MARK_SIGNAL, RECORD_WORKFLOW, STATE_QUERY, CallRecord, record_id

__all__ = ["MARK_SIGNAL", "RECORD_WORKFLOW", "STATE_QUERY", "CallRecord", "record_id"]
