"""exactcall for LangGraph on Temporal (``temporalio-langgraph``): tool calls that happen once.

The public path; the code is in ``exactcall.integrations._langgraph``.
"""

from exactcall.integrations._langgraph import *  # noqa: F403
from exactcall.integrations._langgraph import __all__ as __all__
