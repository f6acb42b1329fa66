"""Errors raised by exactcall.

Every error is a :class:`temporalio.exceptions.ApplicationError`, so raising one inside a
workflow fails the workflow (instead of retrying the workflow task forever), and one raised
inside an activity crosses into the workflow with its ``type`` (the stable ``code``) intact.
``exactcall.call`` turns those failures back into the classes below.

Hierarchy::

    ExactcallError                 base class; .code is stable and machine-readable
    ├── InvalidCall                bad input, refused before anything runs
    │   ├── UnknownTool
    │   └── ArgumentsTooLarge
    ├── NotExecuted                raised BY a tool: "it definitely did not happen" (retryable)
    ├── ToolFailed                 definite failure after the retry policy gave up
    ├── AmbiguousOutcome           the effect may or may not have happened: never re-run blindly
    ├── IntentConflict             the key already ran with other arguments; nothing executed
    ├── ResultNotSerializable      the effect happened, its result cannot be recorded
    └── PluginNotInstalled         exactcall.call used on a worker without exactcall.Plugin()
"""

from __future__ import annotations

from typing import Any, ClassVar

from temporalio.exceptions import ApplicationError

__all__ = [
    "AmbiguousOutcome",
    "ArgumentsTooLarge",
    "ExactcallError",
    "IntentConflict",
    "InvalidCall",
    "NotExecuted",
    "PluginNotInstalled",
    "ResultNotSerializable",
    "ToolFailed",
    "UnknownTool",
    "error_from_failure",
]


class ExactcallError(ApplicationError):
    """Base class of every exactcall error.

    ``code`` is stable and machine-readable; it is also the Temporal failure ``type``.
    ``fields`` holds the structured context (tool, step, key, args_hash, ...).
    """

    code: ClassVar[str] = "ExactcallError"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, non_retryable: bool | None = None, **fields: Any) -> None:
        clean = {k: v for k, v in fields.items() if v is not None}
        if non_retryable is None:
            non_retryable = not self.retryable
        super().__init__(message, clean, type=self.code, non_retryable=non_retryable)
        self.fields: dict[str, Any] = clean

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)


class InvalidCall(ExactcallError):
    """The call was refused before anything ran: fix the arguments or the tool."""

    code = "InvalidCall"


class UnknownTool(InvalidCall):
    """No exactcall tool with that name (or object) is known."""

    code = "UnknownTool"


class ArgumentsTooLarge(InvalidCall):
    """The canonical JSON of the arguments is over the tool's size limit."""

    code = "ArgumentsTooLarge"


class NotExecuted(ExactcallError):
    """Raise this from a tool when the effect definitely did not happen.

    It is the only exception (with the types listed in ``not_executed_on=``) that lets
    exactcall retry a side-effecting tool.
    """

    code = "NotExecuted"
    retryable = True

    def __init__(self, message: str, *, retry: bool = True, **fields: Any) -> None:
        super().__init__(message, non_retryable=not retry, **fields)


class ArgumentsNoLongerFit(NotExecuted):
    """A call recorded by an older deploy of its tool cannot be bound to the tool's current
    signature (a parameter added without a default, a renamed one, a value its annotation now
    refuses). Raised before the tool runs, never retried: nothing was executed."""

    code = "ArgumentsNoLongerFit"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message, retry=False, **fields)


class ToolFailed(ExactcallError):
    """The tool failed definitely (it did not happen) and the retry policy gave up."""

    code = "ToolFailed"


class AmbiguousOutcome(ExactcallError):
    """The effect may or may not have happened. exactcall does not re-run it."""

    code = "AmbiguousOutcome"


class IntentConflict(ExactcallError):
    """The call's key already ran (or is running) with different arguments."""

    code = "IntentConflict"


class ResultNotSerializable(ExactcallError):
    """The tool ran (its effect happened) but its result is not JSON-serializable.

    The call is recorded as done, so it is never run again under its key.
    """

    code = "ResultNotSerializable"


class PluginNotInstalled(ExactcallError):
    """exactcall.call ran in a workflow on a worker without exactcall.Plugin()."""

    code = "PluginNotInstalled"


_BY_CODE: dict[str, type[ExactcallError]] = {
    cls.code: cls
    for cls in (
        ExactcallError,
        InvalidCall,
        UnknownTool,
        ArgumentsTooLarge,
        NotExecuted,
        ToolFailed,
        AmbiguousOutcome,
        IntentConflict,
        ResultNotSerializable,
        PluginNotInstalled,
    )
}


def register_error(cls: type[ExactcallError]) -> type[ExactcallError]:
    """Make ``error_from_failure`` know another error class (used by later modules)."""
    _BY_CODE[cls.code] = cls
    return cls


def error_from_failure(err: ApplicationError) -> ExactcallError | None:
    """Rebuild the exactcall error carried by a Temporal ApplicationError, if it is one."""
    cls = _BY_CODE.get(err.type or "")
    if cls is None:
        return None
    fields = err.details[0] if err.details and isinstance(err.details[0], dict) else {}
    rebuilt = cls(err.message, **fields)
    rebuilt.__cause__ = err
    return rebuilt
