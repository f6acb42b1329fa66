"""A web inbox for approvers (``exactcall inbox``), and notifications of approval events.

Over the same client code as the CLI (``exactcall.approvals``, the audit): the calls waiting
for a person, one call's exact arguments and hash, approve/deny bound to that hash, a run's
calls. The approver's name comes from authentication (tokens or a verified proxy header),
never from a form. See docs/inbox.md.
"""

from exactcall.inbox._auth import Authenticator, Identity, ProxyAuth, TokenAuth
from exactcall.inbox._notify import Event, Notifier, Webhook
from exactcall.inbox._server import EventLoop, Inbox
from exactcall.inbox._tokens import TokenStore, issue_token

__all__ = [
    "Authenticator",
    "Event",
    "EventLoop",
    "Identity",
    "Inbox",
    "Notifier",
    "ProxyAuth",
    "TokenAuth",
    "TokenStore",
    "Webhook",
    "issue_token",
]
