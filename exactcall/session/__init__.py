"""``exactcall.session``: guarded calls from code that is not a workflow (a script, a crew,
a web process). Each call is a Temporal activity run once by exactcall's own workflow for
that call, on a worker inside the calling process: the same intent, derived key, approvals,
budgets and unknown outcomes as ``exactcall.call`` in a workflow. See docs/session.md."""

from exactcall.session._errors import ApprovalPending, SessionBusy
from exactcall.session._session import Session, session
from exactcall.session._sync import SessionSync, session_sync

__all__ = ["ApprovalPending", "Session", "SessionBusy", "SessionSync", "session", "session_sync"]
