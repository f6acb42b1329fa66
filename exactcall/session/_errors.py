"""The errors of ``exactcall.session``, and an outcome's error rebuilt in the caller."""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ApplicationError

import exactcall.approvals._binding  # noqa: F401  (registers the approval errors' codes)
from exactcall._errors import ExactcallError, error_from_failure, register_error

__all__ = ["ApprovalPending", "SessionBusy", "rebuilt"]


@register_error
class ApprovalPending(ExactcallError):
    """``s.call(..., wait=False)``: the call waits for a person. Nothing ran; the call keeps
    waiting in Temporal (``exactcall approvals list``). ``.command`` approves it; the same
    call at the same step later (the process started again from the top, or
    ``key=err.step``) gets its outcome."""

    code = "ApprovalPending"


@register_error
class SessionBusy(ExactcallError):
    """Another live process holds the session: one process at a time."""

    code = "SessionBusy"


def rebuilt(code: str | None, message: str | None, fields: dict[str, Any]) -> ExactcallError:
    """The exactcall error a session call's workflow recorded, as its class."""
    err = error_from_failure(ApplicationError(message or "", fields, type=code or ""))
    return err if err is not None else ExactcallError(message or str(code), **fields)
