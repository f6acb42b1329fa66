"""Approvals bound to the exact arguments of a call (installed as ``exactcall.approvals``).

Not built yet: a later issue adds the approval signal, the pending-call query and the CLI.
"""

__all__: list[str] = []
