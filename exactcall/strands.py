"""exactcall for Strands Agents on Temporal (``pip install 'exactcall[strands]'``).

The public path; the code is in ``exactcall.integrations._strands``.
"""

from exactcall.integrations._strands import *  # noqa: F403
from exactcall.integrations._strands import __all__ as __all__
