"""exactcall for the Google Gen AI SDK on Temporal (``pip install 'exactcall[google-genai]'``).

The public path; the code is in ``exactcall.integrations._google_genai``.
"""

from exactcall.integrations._google_genai import *  # noqa: F403
from exactcall.integrations._google_genai import __all__ as __all__
