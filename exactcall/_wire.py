"""exactcall's wire contract: every name a running workflow, a stored history or a deployed
worker depends on. Changing one breaks workflows in flight; adding one is safe.

Workflow types, signals, queries, updates, memo keys, search attributes, activity names, id
formats, headers and patch ids live here and nowhere else; this module imports nothing of
exactcall's, so every layer (``activities/``, ``workflows/``, ``approvals/``, the client API,
the CLI) reads the same names without importing each other.
"""

from __future__ import annotations

__all__ = [
    "APPROVALS_QUERY",
    "AUDIT_EXPORT_FORMAT",
    "AWAIT_SETTLED",
    "BUDGETS_PATCH",
    "BUDGET_ACTIVITY",
    "BUDGET_ALLOWANCES",
    "BUDGET_BATCH_SIGNAL",
    "BUDGET_BATCH_UPDATE",
    "BUDGET_MEMO",
    "BUDGET_OVER",
    "BUDGET_REFUSALS_RECORDED",
    "BUDGET_RESERVE_UPDATE",
    "BUDGET_SETTLE_SIGNAL",
    "BUDGET_SPENDS_CARRIED",
    "BUDGET_STATE_QUERY",
    "BUDGET_TASK_QUEUE",
    "BUDGET_WORKFLOW",
    "CANCELLED_MEMO",
    "CANCELLED_SIGNAL",
    "CANCELLED_WHILE_JOINING",
    "CANCEL_PATCH",
    "CARRY_HEADER",
    "DECIDE_SIGNAL",
    "JOINED_SIGNAL",
    "JOINS_STARTED_RECONCILIATION",
    "JOIN_CANCELLED_BEFORE_SENT",
    "KEY_SCHEME",
    "LANGGRAPH_APPROVAL_INTERRUPT",
    "LANGGRAPH_CALL_ID_FIELD",
    "MARKS_BY_ACTIVITY",
    "MARK_RECORD",
    "MARK_SIGNAL",
    "MCP_PROXY_APPROVAL_SEEN",
    "MCP_PROXY_APPROVED_WORKFLOW",
    "MCP_PROXY_AWAIT_SETTLED",
    "MCP_PROXY_DELIVERED_SIGNAL",
    "MCP_PROXY_ID_PREFIX",
    "MCP_PROXY_LINGERS",
    "MCP_PROXY_NEXT_SIGNAL",
    "MCP_PROXY_OWNED_WORKFLOW",
    "MCP_PROXY_OWNER_ALIVE_SIGNAL",
    "MCP_PROXY_OWNER_REPORT_SIGNAL",
    "MCP_PROXY_OWNER_REPORT_UPDATE",
    "MCP_PROXY_OWNER_WITHDRAW_UPDATE",
    "MCP_PROXY_TOOL",
    "MCP_PROXY_TOOL_VERSION",
    "MCP_PROXY_WAIT_UPDATE",
    "MCP_PROXY_WITHDRAW_SIGNAL",
    "MCP_PROXY_WORKFLOW",
    "PENDING_ATTRIBUTE",
    "PENDING_MEMO",
    "PROBE_PREFIX",
    "PYDANTIC_AI_ARGS_HASH",
    "READ_HEADER",
    "READ_PATH_BY_DECLARATION",
    "RECONCILE_DECIDES_AT_START",
    "RECONCILE_OUTWAITS_THE_CLAIM",
    "RECONCILE_STATE_QUERY",
    "RECONCILE_WORKFLOW",
    "RECORD_STATE_QUERY",
    "RECORD_WORKFLOW",
    "REFUSED_MEMO",
    "REQUESTED_BY_MEMO",
    "RESOLVE_SIGNAL",
    "RUN_CLAIM_WORKFLOW",
    "SEARCH_ATTRIBUTES_OFF_PATCH",
    "SEARCH_ATTRIBUTES_ON_PATCH",
    "SESSION_CALL_WORKFLOW",
    "SESSION_HOLD_ACTIVITY",
    "SESSION_LOCK_ACQUIRE_UPDATE",
    "SESSION_LOCK_RELEASE_UPDATE",
    "SESSION_LOCK_WORKFLOW",
    "SETTLED_BY_SIGNAL",
    "SETTLED_SIGNAL",
    "SETTLE_PREFIX",
    "TELLS_THE_CALL",
    "UNDO_FAILED_MEMO",
    "UNDO_KEYS_OF_THE_RUN",
    "UNDO_WORKFLOW",
    "UNRESOLVED_ATTRIBUTE",
    "UNRESOLVED_MEMO",
    "VERDICT_MEMO",
    "budget_id",
    "probe_activity_name",
    "reconcile_id",
    "record_id",
    "run_claim_id",
    "session_call_id",
    "session_id_prefix",
    "settle_activity_id",
    "undo_id",
]

# -- the key ---------------------------------------------------------------------------------
KEY_SCHEME = "exactcall.key/v1"
"""First element of the key's preimage (``exactcall._canonical.derive_key``)."""

# -- workflow types, and the ids of their runs -----------------------------------------------
RECORD_WORKFLOW = "exactcall.CallRecord"
"""A call's per-key record (runs with per-call claims, and off a run's happy path)."""
RECONCILE_WORKFLOW = "exactcall.Reconcile"
"""The reconciliation of a call whose outcome is unknown."""
RUN_CLAIM_WORKFLOW = "exactcall.RunClaim"
"""A workflow id's run claim (never registered: it runs no code)."""
MCP_PROXY_WORKFLOW = "exactcall.mcp.ProxyCall"
MCP_PROXY_APPROVED_WORKFLOW = "exactcall.mcp.ProxyCallApproved"
MCP_PROXY_OWNED_WORKFLOW = "exactcall.mcp.ProxyOwnedCall"
"""A write call that the proxy which started the run sends itself (no activity): the run
holds its identity and outcome for retries, and its intent is the run's input."""
MCP_PROXY_ID_PREFIX = "exactcall-proxy-"
"""Workflow ids of the MCP proxy's calls start with it."""


def record_id(key: str) -> str:
    """Workflow id of the record of ``key``."""
    return f"exactcall-call-{key}"


def reconcile_id(key: str) -> str:
    """Workflow id of the reconciliation of ``key``."""
    return f"exactcall-reconcile-{key}"


def run_claim_id(workflow_id: str) -> str:
    """Workflow id of the run claim of ``workflow_id``."""
    return f"exactcall-run-{workflow_id}"


# -- activities --------------------------------------------------------------------------------
# a tool's activity is named by the tool (``@exactcall.tool(name=...)``)
MARK_RECORD = "exactcall.mark_record"
"""The local activity that writes a marker from workflow code."""
AWAIT_SETTLED = "exactcall.await_settled"
"""Waits for a reconciliation's verdict (histories from before SETTLED_BY_SIGNAL)."""
MCP_PROXY_TOOL = "exactcall.mcp_proxy"
MCP_PROXY_TOOL_VERSION = "1"
"""Part of the key the proxy derives for a write (with the workflow id and step)."""
MCP_PROXY_AWAIT_SETTLED = "exactcall.mcp.await_settled"
PROBE_PREFIX = "exactcall.probe."
SETTLE_PREFIX = "exactcall.settle:"


def probe_activity_name(tool: str) -> str:
    """Activity name of ``tool``'s reconciliation probe."""
    return PROBE_PREFIX + tool


def settle_activity_id(activity_id: str) -> str:
    """Activity id of the attempt that settles a cancelled call from its markers."""
    return SETTLE_PREFIX + activity_id


# -- signals, queries, updates -----------------------------------------------------------------
DECIDE_SIGNAL = "exactcall.decide"
"""An approval decision, to the workflow of the call (added at its first exactcall call)."""
APPROVALS_QUERY = "exactcall.approvals"
"""The workflow's approvals: pending, decided, pre-approved."""
MARK_SIGNAL = "exactcall.mark"
"""A marker, to a call record."""
RECORD_STATE_QUERY = "exactcall.state"
"""A call record's state."""
RESOLVE_SIGNAL = "exactcall.resolve"
"""A person's verdict, to a reconciliation."""
RECONCILE_STATE_QUERY = "exactcall.reconcile_state"
"""A reconciliation's state."""
SETTLED_SIGNAL = "exactcall.settled"
"""A reconciliation's verdict, to the workflow of the call."""
JOINED_SIGNAL = "exactcall.joined"
"""The workflow of the call joins a reconciliation it did not start."""
CANCELLED_SIGNAL = "exactcall.call_cancelled"
"""The workflow of the call cancelled it, to its reconciliation."""
MCP_PROXY_WAIT_UPDATE = "exactcall.mcp.wait"
MCP_PROXY_DELIVERED_SIGNAL = "exactcall.mcp.delivered"
"""A proxy wrote a call's final answer to its client: the call's workflow may end (in mode
``retry``), so the next identical call is a new call."""
MCP_PROXY_WITHDRAW_SIGNAL = "exactcall.mcp.withdraw"
"""A client cancelled its request: when no other caller waits, the call is cancelled."""
MCP_PROXY_NEXT_SIGNAL = "exactcall.mcp.next"
"""An identical call sent after the answer was delivered waits for a new run: the lingering
run ends now."""
MCP_PROXY_OWNER_REPORT_SIGNAL = "exactcall.mcp.owner-report"
"""The proxy that owns a ProxyOwnedCall run: what the call did (sent before it answers)."""
MCP_PROXY_OWNER_REPORT_UPDATE = "exactcall.mcp.owner-report-now"
"""The same report, answered once the run acted on it (an unknown outcome's reconciliation
has started)."""
MCP_PROXY_OWNER_ALIVE_SIGNAL = "exactcall.mcp.owner-alive"
"""The owning proxy still waits for the server (every second while a call runs)."""
MCP_PROXY_OWNER_WITHDRAW_UPDATE = "exactcall.mcp.owner-withdraw"
"""The owning proxy's client cancelled: whether any other caller still waits."""
MCP_PROXY_LINGERS = "exactcall.mcp.lingers"
"""Patch, asked before the run's first await: in mode ``retry``, a delivered run stays open a
few seconds for identical calls sent before the answer was delivered (copies still on their
way from another proxy), and ends as soon as a later identical call asks for a new run.
Runs recorded before it end at the first delivery (tests/histories/mcp/proxy_call_retry.json)."""
MCP_PROXY_APPROVAL_SEEN = "exactcall.mcp.approval-seen"
"""Patch, asked by the wait update of a ProxyCallApproved run: the wait answers as soon as the
call waits for a person (its condition reads the run's approval book, found in the update's
own task). Runs recorded before it held the first wait for its whole slice (30 s), since the
condition, checked outside any task, never found the book
(tests/histories/mcp/proxy_approved_call.json)."""

# -- the adapters' names in the frameworks' own state --------------------------------------------
LANGGRAPH_APPROVAL_INTERRUPT = "exactcall.approval"
"""The ``type`` of the interrupt value ``tool_node(..., interrupt_on=...)`` pauses with."""
LANGGRAPH_CALL_ID_FIELD = "exactcall_tool_call_id"
PYDANTIC_AI_ARGS_HASH = "exactcall_args_hash"
"""The key, in ``DeferredToolRequests.metadata[id]`` and ``DeferredToolResults.metadata[id]``,
of the call's exactcall args hash."""

# -- memo keys, search attributes, headers -----------------------------------------------------
PENDING_MEMO = "exactcall.pending"
REQUESTED_BY_MEMO = "exactcall.requested_by"
UNRESOLVED_MEMO = "exactcall.unresolved"
VERDICT_MEMO = "exactcall.verdict"
CANCELLED_MEMO = "exactcall.call_cancelled"
PENDING_ATTRIBUTE = "ExactcallPending"
UNRESOLVED_ATTRIBUTE = "ExactcallUnresolved"
CARRY_HEADER = "exactcall-ordinals"
"""Tool ordinals carried over continue-as-new."""
READ_HEADER = "exactcall-read"
"""On a call's scheduled activity: ``true`` for a read, ``false`` for a write (so a reader of
the history knows it changed nothing, without the tool). Headers are not part of replay."""

# -- patch ids (workflow.patched): each one guards a change to what workflows do ----------------
CANCEL_PATCH = "exactcall.cancellation-reaches-calls"
"""Histories recorded before cancellation reached calls replay as they ran: a cancelled
caller did not cancel its call then."""
SEARCH_ATTRIBUTES_ON_PATCH = "exactcall.search-attributes.on"
SEARCH_ATTRIBUTES_OFF_PATCH = "exactcall.search-attributes.off"
"""Patch markers that pin, in a workflow run's own history, whether it upserts exactcall's
search attributes: the choice is made once per run, at its first upsert, from the worker's
``Plugin(search_attributes=...)``; replays and later tasks follow the history, whatever the
flag of the worker that runs them (an upsert command present or absent would otherwise fail
replay with a nondeterminism error after a rolling change of the flag).

Only the choice "off" is recorded (SEARCH_ATTRIBUTES_OFF_PATCH): a run with no marker upserts
them. A patch marker costs two history events and a visibility write (Temporal also upserts
``TemporalChangeVersion`` with it), so the default pays nothing. Histories recorded while
"on" was recorded too (SEARCH_ATTRIBUTES_ON_PATCH) still replay: their marker is consumed."""
JOINS_STARTED_RECONCILIATION = "exactcall.joins-started-reconciliation"
"""Patch: a cancelled call whose reconciliation was already running (started by the attempt
that found the outcome unknown) tells it so; histories from before it never signalled."""
SETTLED_BY_SIGNAL = "exactcall.settled-by-signal"
"""Patch: a joined reconciliation's verdict comes by signal (``_joined``); histories from
before it waited in an activity."""
CANCELLED_WHILE_JOINING = "exactcall.cancelled-while-joining"
"""Patch: a call cancelled while its join signal was in flight ends cancelled (the SDK lets a
sent signal finish and drops the cancellation); histories from before it waited on."""
JOIN_CANCELLED_BEFORE_SENT = "exactcall.join-cancelled-before-sent"
"""Patch: a call cancelled before its join signal was sent (the SDK then fails the signal with
CancelledError, a FailureError) ends cancelled; before, that error was taken for "the
reconciliation has closed" and the workflow waited for a person's verdict in an activity."""
TELLS_THE_CALL = "exactcall.reconcile-tells-the-call"
"""Patch: a reconciliation that is not a child signals its verdict to the call's workflow."""
READ_PATH_BY_DECLARATION = "exactcall.read-path-by-declaration"
"""Patch: an MCP tool declared ``read_only=None`` takes the write path in the workflow on
every worker; histories from before it took the read path where the worker's trusted server
hinted read-only. Recorded once per run, and only in runs that call such a tool."""
MARKS_BY_ACTIVITY = "exactcall.marks-by-activity"
"""Patch: verdicts are written to the record by a local activity, which opens a record that
has closed (records close by themselves); before, by an external signal."""
RECONCILE_OUTWAITS_THE_CLAIM = "exactcall.reconcile-outwaits-the-claim"
"""Patch, taken in a reconciliation's first workflow task: a probe's "not landed" re-runs the
call only once the attempt that may still be making it has lost its claim to run for sure
(a heartbeat timeout and a second after the reconciliation started), and the probe is asked
again then. Runs from before re-ran at the first "not landed"."""
RECONCILE_DECIDES_AT_START = "exactcall.reconcile-decides-at-start"
"""Patch, taken before the first await of a reconciliation's run (its first workflow task):
such runs pin their search-attribute choice there, tell the call without asking
``reconcile-tells-the-call``, and settle the budget charges their input carries instead of
looking the tool up in the replaying worker's registry (whose imports then decided the run's
commands: a budgeted tool's reconciliation failed replay wherever the tool was not imported).
CI saw ``reconcile-tells-the-call`` fail replay under load; runs recorded before this patch
keep the per-use patches above."""


# -- budgets ---------------------------------------------------------------------------------
BUDGET_WORKFLOW = "exactcall.Budget"
"""A budget's ledger: one per budget (scope namespace), or per budget and workflow id."""
BUDGET_RESERVE_UPDATE = "exactcall.budget.reserve"
BUDGET_SETTLE_SIGNAL = "exactcall.budget.settle"
BUDGET_STATE_QUERY = "exactcall.budget.state"
BUDGET_ACTIVITY = "exactcall.budget"
"""The local activity through which a workflow reserves, spends and releases."""
BUDGET_BATCH_UPDATE = "exactcall.budget.batch"
"""Every operation a worker process has for one ledger at a time, as one Update (reservations
and settles, answered in order): one Update in flight per process and ledger, however many
calls wait (Temporal refuses more than 10 in flight per workflow)."""
BUDGET_BATCH_SIGNAL = "exactcall.budget.settle-batch"
"""Settles only (nothing to answer): one signal for all a process has for one ledger."""
BUDGET_TASK_QUEUE = "exactcall-budgets"
"""Where a ledger started by this version runs: every worker that runs budgeted calls' workflows
polls it (a small worker of its own), so a ledger outlives any caller's task queue."""
BUDGET_ALLOWANCES = "exactcall.budget-allowances"
"""Patch: a run's second and later reservations on a ledger also ask for an allowance (1, 2,
4 ... 16 more calls' worth, at most a quarter of what is free), from which its next calls
draw in the workflow, with no ledger round trip; each drawn call is reported with the run's
spends."""
BUDGET_SPENDS_CARRIED = "exactcall.budget-spends-carried"
"""Patch: a done call's spend is carried by the run's next reservation, or sent when the run's
code ends, instead of at once (one ledger Update per call instead of an Update and a signal)."""
BUDGETS_PATCH = "exactcall.budgets"
"""Marks runs whose budgeted calls reserve (a tool that gains budgets= keeps old runs replaying)."""


def budget_id(name: str, workflow_id: str | None = None) -> str:
    """Workflow id of a budget's ledger (``workflow_id`` for a workflow-scope budget)."""
    return (
        f"exactcall-budget-{name}"
        if workflow_id is None
        else f"exactcall-budget-{name}@{workflow_id}"
    )


BUDGET_OVER = "exactcall.BudgetOver"
"""Failure type of a reservation the ledger's validator refused (over the limit)."""
BUDGET_REFUSALS_RECORDED = "exactcall.budget-refusals-recorded"
"""Patch: a call a budget refuses (``on_exceed="refuse"``) is written to its run's memo
(``REFUSED_MEMO``), so ``exactcall audit`` lists it. Runs from before left no trace of it."""
REFUSED_MEMO = "exactcall.refused"
"""A run's memo entry for its latest refused call (each upsert, in the history, is one)."""
BUDGET_MEMO = "exactcall.budget.totals"
"""A ledger's totals per window (what ``exactcall budgets`` lists without a worker)."""

# -- undo ------------------------------------------------------------------------------------
UNDO_WORKFLOW = "exactcall.Undo"
"""``exactcall undo WORKFLOW_ID``: undoes a run's done calls after the fact."""


UNDO_KEYS_OF_THE_RUN = "exactcall.undo-keys-of-the-run"
"""Patch: ``exactcall undo`` makes each undo as the undone run's own call (its workflow id,
step ``<step>.undo``), so it has the key the run's saga would give it, whichever process
makes it; it does not wait for an unknown undo's verdict (it reports it). Runs of the undo
workflow from before made each undo under the undo workflow's own id."""


UNDO_FAILED_MEMO = "exactcall.undo_failed"
"""On a workflow whose saga (or ``exactcall undo``) had undos fail: which steps and why
(with the ``ExactcallUnresolved`` search attribute, so ``exactcall unresolved`` lists them)."""


def undo_id(workflow_id: str) -> str:
    """Workflow id of the undo of ``workflow_id``'s calls (one per workflow id: undoing it
    again is a re-run of the same id, whose calls exactcall runs once)."""
    return f"exactcall-undo-{workflow_id}"


# -- sessions (exactcall.session: guarded calls from code that is not a workflow) -----------
SESSION_CALL_WORKFLOW = "exactcall.SessionCall"
"""One call of an ``exactcall.session``: the workflow whose one exactcall call runs it."""
SESSION_LOCK_WORKFLOW = "exactcall.SessionLock"
"""Which process holds a session: one live process at a time."""
SESSION_LOCK_ACQUIRE_UPDATE = "exactcall.session.acquire"
SESSION_LOCK_RELEASE_UPDATE = "exactcall.session.release"
SESSION_HOLD_ACTIVITY = "exactcall.session.hold"
"""Runs in the holding process while it lives (its heartbeats are the lease)."""


def session_id_prefix(session: str) -> str:
    """Workflow id of a session's lock; its calls' ids are this + ``/`` + the step (``/`` and
    ``%`` in the session id escaped, so the session id ends at the first ``/``)."""
    return "exactcall-session-" + session.replace("%", "%25").replace("/", "%2F")


def session_call_id(session: str, step: str) -> str:
    """Workflow id of the call at ``step`` of ``session``."""
    return f"{session_id_prefix(session)}/{step}"


# -- audit -----------------------------------------------------------------------------------
AUDIT_EXPORT_FORMAT = "exactcall.audit/v1"
"""The ``format`` of an ``exactcall audit export`` header."""
