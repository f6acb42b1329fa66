"""The one tool classifier of ``exactcall mcp proxy`` and ``exactcall mcp scan``.

Both ask it the same question, "is this tool a read?", from the same evidence: the tool's
annotations, then its name. The name is split into words at ``_ - . /`` and camelCase
(``sendSlackMessage`` -> ``send slack message``, ``HTTPGet`` -> ``http get``).

A name is a **read** when its first word is a read verb (:data:`READ_VERBS`: ``get``,
``list``, ``search``, ``read``, ``open``, ``find``, ``show``, ``fetch``, ``query``, ``echo``,
...) and nothing in it is evidence of a write:

* a high-risk verb (:data:`HIGH_RISK`: ``delete``, ``send``, ``transfer``, ``exec``, ...) or a
  write word (:data:`WRITE_WORDS`: ``create``, ``update``, ``append``, ...) anywhere in the
  name beats the read verb: ``get_and_delete`` and ``list_and_clear`` are writes. A word that is
  also a noun (:data:`NOUN_TOO`: ``run``, ``post``, ``email``, ``commit``, ``schedule``, ...)
  after a read verb is its object (``get_workflow_run``, ``read_email`` are reads) unless an
  ``and``/``or``/``then`` comes before it (``get_and_commit`` is a write);
* ``open`` is a read (the memory server's ``open_nodes``, ``open_file``) except when its object
  is something opening creates (:data:`OPEN_CREATES`: ``open_ticket``, ``openPullRequest``,
  ``open_account`` are writes).

Annotations: ``readOnlyHint: true`` makes a tool a read for the proxy only when the user marks
the server trusted (``--trusted``): the MCP spec says hints of untrusted servers must not decide
anything. The scan's risk level (:func:`risk`) keeps a hint as evidence of a low risk, and
evidence of a write in the name wins over it there. :class:`exactcall.mcp._proxy_policy.Policy`
adds the user's flags (``--read-only``, ``--write``, ``--approve``) in front of this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HIGH_RISK",
    "NOUN_TOO",
    "OPEN_CREATES",
    "READ_VERBS",
    "WRITE_WORDS",
    "NameEvidence",
    "first_word",
    "hints",
    "name_evidence",
    "read_by_name",
    "read_for_proxy",
    "risk",
    "words",
]

READ_VERBS = frozenset(
    {
        "get", "list", "search", "read", "open", "find", "show", "describe", "fetch", "query",
        "view", "count", "check", "echo", "lookup", "status", "info", "inspect", "browse",
        "preview", "whoami", "retrieve", "peek", "ping", "explain", "diff", "compare", "locate",
        "grep", "stat", "exists",
    }
)  # fmt: skip
"""First words that make a name a read (when nothing else in it is a write)."""

# (verbs, nouns, what they mean): a verb anywhere in the name is high risk; a noun is, unless
# the name starts with a read verb (``send_message`` is high, ``read_message`` is not)
HIGH_RISK: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (
        ("transfer", "pay", "refund", "charge", "withdraw", "wire", "purchase", "buy"),
        ("payment", "payout", "money", "funds", "invoice"),
        "moves money",
    ),
    (
        ("delete", "remove", "destroy", "drop", "purge", "wipe", "erase", "truncate", "rm",
         "unlink", "revoke"),
        (),
        "deletes",
    ),
    (
        ("exec", "execute", "run", "eval", "spawn"),
        ("shell", "bash", "command", "script", "terminal", "subprocess", "sql", "code"),
        "runs code",
    ),
    (
        ("send", "post", "publish", "tweet", "notify", "reply", "dm", "broadcast", "email"),
        ("message", "mail", "sms", "notification"),
        "sends messages",
    ),
)  # fmt: skip
WRITE_WORDS = frozenset(
    {
        "create", "add", "insert", "update", "set", "write", "edit", "modify", "change", "put",
        "patch", "upload", "save", "move", "rename", "assign", "close", "merge", "commit",
        "push", "deploy", "install", "approve", "cancel", "book", "schedule", "invite",
        "archive", "restore", "enable", "disable", "start", "stop", "restart", "kill", "lock",
        "append", "submit", "register", "grant", "apply", "replace", "clear", "reset", "mark",
        "upsert", "increment", "import", "sync",
    }
)  # fmt: skip
"""Words of a write (not high risk): anywhere in a name they make it a write."""
NOUN_TOO = frozenset(
    {
        "update", "set", "edit", "change", "put", "patch", "upload", "move", "close", "merge",
        "commit", "push", "deploy", "install", "book", "schedule", "invite", "archive",
        "restore", "start", "stop", "lock", "register", "grant", "mark", "import", "sync",
        "transfer", "pay", "refund", "charge", "wire", "purchase", "buy", "drop", "run",
        "eval", "post", "tweet", "reply", "dm", "broadcast", "email",
    }
)  # fmt: skip
"""Write and high-risk verbs that are nouns too: after a read verb, the object it reads
(``get_commit``, ``get_workflow_run``), unless an ``and``/``or``/``then`` comes before them."""
OPEN_CREATES = frozenset(
    {
        "ticket", "issue", "pr", "pull", "request", "account", "case", "incident", "order",
        "position", "session", "trade", "bug", "dispute", "claim", "thread", "conversation",
        "chat", "channel", "room", "deal", "lead", "opportunity", "job", "shift", "tab",
        "window",
    }
)  # fmt: skip
"""What opening creates: ``open_ticket`` is a write, ``open_nodes`` / ``open_file`` reads."""
_CONJUNCTIONS = frozenset({"and", "or", "then"})
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_DESCRIPTION_HIGH = re.compile(
    r"\b(send(s|ing)? (money|funds|payments?|e-?mails?|messages?)|transfers? (money|funds)"
    r"|delet(e|es|ing)|execut(e|es|ing) (code|commands?|scripts?|shell)"
    r"|shell commands?|arbitrary code|charges? (a|the) (card|customer))\b",
    re.IGNORECASE,
)
_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def words(name: str) -> list[str]:
    """``sendSlackMessage`` / ``send-slack.message`` -> ``["send", "slack", "message"]``."""
    return [w.lower() for w in _WORDS.findall(name)]


def first_word(name: str) -> str:
    """``get_user`` / ``getUser`` / ``get-user`` / ``files.get`` -> ``get`` / ``files``."""
    ws = words(name)
    return ws[0] if ws else ""


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


@dataclass(frozen=True)
class NameEvidence:
    """What a tool's name says: its read verb, and the evidence of a write in it."""

    name: str
    words: tuple[str, ...]
    read_verb: str | None
    """The first word, when it is a read verb."""
    high: tuple[tuple[str, str], ...]
    """(word, what it means) for each high-risk class the name matches."""
    write: str | None
    """The first sign of a write that is not high risk: ``'update'``, ``'open' + 'ticket'``."""
    write_note: str = "a write"
    """What :attr:`write` means: ``a write``, or ``opening one creates it``."""

    @property
    def read(self) -> bool:
        return self.read_verb is not None and not self.high and self.write is None

    def write_reason(self) -> str | None:
        """Why the name is a write, readable (``None`` when it shows none)."""
        if self.high:
            word, meaning = self.high[0]
            return f"the name has {word!r} ({meaning})"
        if self.write is not None:
            return f"the name has {self.write} ({self.write_note})"
        return None


def name_evidence(name: str) -> NameEvidence:
    """Classify a name by its words (see the module doc)."""
    ws = words(name)
    read_verb = ws[0] if ws and ws[0] in READ_VERBS else None
    counted: list[str] = []  # the words that can be evidence of a write
    after_conjunction = False
    for i, w in enumerate(ws):
        if w in _CONJUNCTIONS:
            after_conjunction = True
        elif i == 0 or read_verb is None or after_conjunction or w not in NOUN_TOO:
            counted.append(w)
    high: list[tuple[str, str]] = []
    for verbs, nouns, meaning in HIGH_RISK:
        hit = next((w for w in counted if w in verbs or (w in nouns and read_verb is None)), None)
        if hit is not None:
            high.append((hit, meaning))
    write = next((repr(w) for w in counted if w in WRITE_WORDS), None)
    if write is None and read_verb == "open":
        made = next((w for w in ws[1:] if _singular(w) in OPEN_CREATES), None)
        if made is not None:
            note = "opening one creates it"
            return NameEvidence(name, tuple(ws), read_verb, tuple(high), f"'open' + {made!r}", note)
    return NameEvidence(name, tuple(ws), read_verb, tuple(high), write)


def read_by_name(name: str) -> tuple[bool, str]:
    """(whether the name is a read, why): the name rule alone."""
    ev = name_evidence(name)
    if ev.read:
        return True, f"the name starts with {ev.read_verb!r}"
    why = ev.write_reason()
    if why is not None:
        return False, f"not read-only: {why}"
    return False, "not known to be read-only"


def hints(annotations: Any) -> dict[str, Any]:
    """The ``*Hint`` fields of a tool's annotations (a wire dict or a ``ToolAnnotations``)."""
    if annotations is None:
        return {}
    if not isinstance(annotations, Mapping):
        dump = getattr(annotations, "model_dump", None)
        annotations = dump(by_alias=True, exclude_none=True) if dump else {}
    return {k: annotations[k] for k in _HINTS if annotations.get(k) is not None}


def read_for_proxy(name: str, annotations: Any, trusted: bool) -> tuple[bool, str]:
    """(whether the proxy passes the tool through as a read, why), before the user's flags:
    a trusted server's ``readOnlyHint: true`` (unless the name says write: evidence of a
    write wins over the hint, as in :func:`risk`), then the name."""
    if trusted and hints(annotations).get("readOnlyHint") is True:
        ev = name_evidence(name)
        if ev.high:
            w, meaning = ev.high[0]
            return False, f"name matches {w!r} ({meaning}) despite readOnlyHint=true"
        if ev.write:
            return False, f"name matches {ev.write} ({ev.write_note}) despite readOnlyHint=true"
        return True, "readOnlyHint=true on a trusted server"
    return read_by_name(name)


def risk(name: str, description: str, annotations: Any) -> tuple[str, tuple[str, ...]]:
    """The scan's risk level (``low``, ``medium``, ``high``) and its reasons.

    * **high**: a high-risk word in the name (see :data:`HIGH_RISK`), a high-risk phrase in the
      description, or ``destructiveHint: true`` (without ``readOnlyHint: true``);
    * **low**: ``readOnlyHint: true`` or a read by name (:func:`name_evidence`), with no sign
      of a write (``readOnlyHint: false`` is one);
    * **medium**: the rest (a write, or nothing says it is not).

    Evidence of a write in the name wins over ``readOnlyHint`` (which counts here on any
    server: a low risk says what the server claims, the proxy column what it will do).
    """
    h = hints(annotations)
    read_hint = h.get("readOnlyHint") is True
    ev = name_evidence(name)
    high = [f"name matches {w!r} ({meaning})" for w, meaning in ev.high]
    m = _DESCRIPTION_HIGH.search(description or "")
    if m:
        high.append(f"description says {m.group(0)!r}")
    if h.get("destructiveHint") is True and not read_hint:
        high.append("destructiveHint=true")
    if high:
        if read_hint:
            high.append("readOnlyHint=true ignored: high-risk evidence wins over a hint")
        return "high", tuple(high)
    if read_hint:
        if ev.write is not None:
            why = f"name matches {ev.write} ({ev.write_note}) despite readOnlyHint=true"
            return "medium", (why,)
        return "low", ("readOnlyHint=true",)
    if ev.read and h.get("readOnlyHint") is False:
        return "medium", ("readOnlyHint=false (the server says it writes), despite the name",)
    if ev.read:
        return "low", (f"name starts with {ev.read_verb!r} (read-only by name; no readOnlyHint)",)
    reasons = [
        f"name matches {ev.write} ({ev.write_note})" if ev.write else "not marked readOnlyHint"
    ]
    if h.get("idempotentHint") is True:
        reasons.append("idempotentHint=true")
    return "medium", tuple(reasons)
