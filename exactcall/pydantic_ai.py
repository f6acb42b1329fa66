"""exactcall for Pydantic AI agents on Temporal (``pip install 'exactcall[pydantic-ai]'``).

The public path; the code is in ``exactcall.integrations._pydantic_ai``.
"""

from exactcall.integrations._pydantic_ai import *  # noqa: F403
from exactcall.integrations._pydantic_ai import __all__ as __all__
