"""What the agent-framework adapters share: which exactcall errors a model sees.

One rule for OpenAI Agents, Pydantic AI and LangGraph. An error in ``MODEL_ERRORS`` is a
tool error the model can answer, and the run goes on. Any other exactcall error fails the
run:

* ``AmbiguousOutcome`` (an unknown outcome of an ``on_unknown="raise"`` tool): a model told
  "it failed" would call again, which is a new step with a new key, and may pay twice. The
  reconciliation goes on without the run, and ``exactcall unresolved`` lists the call.
* ``ResultNotSerializable``: the tool ran, and a retry would run it again.
* ``PluginNotInstalled`` and the like: a worker set up wrong. That must fail loudly, not reach
  a model.
"""

from __future__ import annotations

from ._errors import ExactcallError, IntentConflict, InvalidCall, ToolFailed
from ._verdicts import CallAbandoned
from .approvals._binding import ApprovalDenied, ApprovalExpired, ApprovalMissing

__all__ = ["MODEL_ERRORS"]

MODEL_ERRORS: tuple[type[ExactcallError], ...] = (
    ApprovalDenied,  # a person said no: the model can tell the user, or ask for less
    ApprovalExpired,  # nobody decided in time: nothing ran
    ApprovalMissing,  # the call needs an approval it does not have: nothing ran
    IntentConflict,  # the step already ran with other arguments: nothing ran
    ToolFailed,  # a definite failure (it did not happen, or a re-run failed)
    CallAbandoned,  # a person gave up on an unknown outcome: the call will not be retried
    InvalidCall,  # arguments that do not fit the signature: nothing ran, the model can fix them
)
"""The exactcall errors a model sees as tool errors (see the module's docstring)."""
