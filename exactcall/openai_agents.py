"""exactcall for the OpenAI Agents SDK on Temporal (``pip install 'exactcall[openai-agents]'``).

The public path; the code is in ``exactcall.integrations._openai_agents``.
"""

from exactcall.integrations._openai_agents import *  # noqa: F403
from exactcall.integrations._openai_agents import __all__ as __all__
