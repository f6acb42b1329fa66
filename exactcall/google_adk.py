"""exactcall for Google ADK agents on Temporal (``pip install 'exactcall[google-adk]'``).

The public path; the code is in ``exactcall.integrations._google_adk``.
"""

from exactcall.integrations._google_adk import *  # noqa: F403
from exactcall.integrations._google_adk import __all__ as __all__
