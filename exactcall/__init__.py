"""exactcall: AI agents' side effects on Temporal, once.

Each tool call is a Temporal activity whose intent (tool, canonical arguments, their sha256,
workflow id, step, derived idempotency key) is persisted before the effect; every attempt
knows what the previous one did; a call that may have happened is never re-run blindly.

    import exactcall

    @exactcall.tool
    async def pay(amount: int, to: str, *, idempotency_key: str) -> dict: ...

    # inside a workflow
    receipt = await exactcall.call(pay, amount=10, to="alice")

    # anywhere else (a script, a crew, a web process)
    async with exactcall.session("order-42") as s:
        receipt = await s.call(pay, amount=10, to="alice")
"""

from exactcall._canonical import args_hash, canonical_json, derive_key, to_json_value
from exactcall._context import current_intent, idempotency_headers, idempotency_key
from exactcall._errors import (
    AmbiguousOutcome,
    ArgumentsNoLongerFit,
    ArgumentsTooLarge,
    ExactcallError,
    IntentConflict,
    InvalidCall,
    NotExecuted,
    PluginNotInstalled,
    ResultNotSerializable,
    ToolFailed,
    UnknownTool,
)
from exactcall._model import Intent, RecordState
from exactcall._plugin import Plugin
from exactcall._tool import Tool, ToolOptions, get_tool, intent_hash, registered_tools, tool
from exactcall.activities._claim import check_claim, check_claim_async
from exactcall.approvals._binding import ApprovalDenied, ApprovalExpired, ApprovalMissing
from exactcall.budgets._budget import Budget, BudgetExceeded
from exactcall.reconciliation._verdicts import CallAbandoned, Landed, NotLanded, Unknown
from exactcall.session import ApprovalPending, SessionBusy, session, session_sync
from exactcall.undo._undo import Done, UndoFailed, UndoReport
from exactcall.workflows._call import call, call_with
from exactcall.workflows._saga import Saga, saga

__version__ = "0.1.0"

__all__ = [
    "AmbiguousOutcome",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalMissing",
    "ApprovalPending",
    "ArgumentsNoLongerFit",
    "ArgumentsTooLarge",
    "Budget",
    "BudgetExceeded",
    "CallAbandoned",
    "Done",
    "ExactcallError",
    "Intent",
    "IntentConflict",
    "InvalidCall",
    "Landed",
    "NotExecuted",
    "NotLanded",
    "Plugin",
    "PluginNotInstalled",
    "RecordState",
    "ResultNotSerializable",
    "Saga",
    "SessionBusy",
    "Tool",
    "ToolFailed",
    "ToolOptions",
    "UndoFailed",
    "UndoReport",
    "Unknown",
    "UnknownTool",
    "__version__",
    "args_hash",
    "call",
    "call_with",
    "canonical_json",
    "check_claim",
    "check_claim_async",
    "current_intent",
    "derive_key",
    "get_tool",
    "idempotency_headers",
    "idempotency_key",
    "intent_hash",
    "registered_tools",
    "saga",
    "session",
    "session_sync",
    "to_json_value",
    "tool",
]
