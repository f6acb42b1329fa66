"""What exactcall's agent-framework adapters share, and what an adapter of your own needs.

The public path; the code is in ``exactcall.integrations._adapters``.
"""

from exactcall.integrations._adapters import *  # noqa: F403
from exactcall.integrations._adapters import __all__ as __all__
