"""``@exactcall.tool``: a function that becomes a Temporal activity with a recorded intent.

Binding and canonicalisation are pure (they run inside workflows): the call's arguments are
bound to the tool's signature, defaults applied, validated against the annotations with
pydantic and written as plain JSON. That canonical form is what is hashed, persisted, approved
and, after validation on the worker, handed to the function.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, overload

import pydantic
import structlog
from temporalio import workflow
from temporalio.common import RetryPolicy

from exactcall._canonical import JsonValue, args_hash, canonical_json, to_json_value
from exactcall._errors import (
    ArgumentsNoLongerFit,
    ArgumentsTooLarge,
    ExactcallError,
    InvalidCall,
    UnknownTool,
)

if typing.TYPE_CHECKING:
    from exactcall._model import Intent

__all__ = [
    "DEFAULT_MAX_ARGS_BYTES",
    "Tool",
    "get_tool",
    "intent_hash",
    "registered_tools",
    "resolve_tool",
    "tool",
]

log = structlog.get_logger("exactcall")

DEFAULT_MAX_ARGS_BYTES = 256 * 1024
DEFAULT_APPROVAL_TIMEOUT = timedelta(hours=24)
KEY_PARAM = "idempotency_key"
_MAX_ADDED = 8
"""Parameters at their default that Tool.older_hashes considers added (2**8 hashes at most)."""

DEFAULT_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)


@dataclass(frozen=True)
class ToolOptions:
    """How one tool runs. Every field has a default that is safe for a side-effecting call."""

    name: str
    """Activity name, and the ``tool`` in intents and hashes."""
    version: str = "1"
    """Part of the derived key: bump it when a call with the same args must run anew."""
    read_only: bool = False
    """Never deduplicated, no markers: for lookups that change nothing."""
    provider_idempotent: bool | timedelta = False
    """The provider dedupes on the key (Stripe's Idempotency-Key): a possibly-executed
    attempt is re-called with the same key instead of ending as AmbiguousOutcome."""
    task_queue: str | None = None
    """Task queue of the tool's activity; the calling workflow's queue when None."""
    start_to_close_timeout: timedelta = timedelta(minutes=10)
    """Upper bound of one attempt (exactcall heartbeats for the tool while it runs)."""
    heartbeat_timeout: timedelta = timedelta(seconds=5)
    """A crashed attempt is noticed after this long; the next attempt then settles it."""
    retry_policy: RetryPolicy = field(default_factory=lambda: DEFAULT_RETRY_POLICY)
    """Retries of *definite* failures (NotExecuted); crashed attempts are always followed up."""
    not_executed_on: tuple[type[BaseException], ...] = ()
    """Exception types that mean "it did not happen" (retryable), besides NotExecuted."""
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES
    """Calls whose canonical arguments are larger than this are refused before running."""
    approval: bool | Callable[[Any], bool] = False
    """True, or a policy ``(intent) -> bool`` (deterministic: it runs in the workflow): the
    call waits for a person to approve its exact arguments."""
    approval_timeout: timedelta = DEFAULT_APPROVAL_TIMEOUT
    """How long a request waits before it ends as ApprovalExpired."""
    approvers: frozenset[str] | None = None
    """Only these names may approve (None: anyone)."""
    min_approvals: int = 1
    """Distinct approvers needed (M of N)."""
    requester_may_approve: bool = True
    """False: the workflow's requester (memo ``exactcall.requested_by``) cannot approve."""
    reconcile: Callable[[Any], Any] | None = None
    """A probe ``(intent) -> Landed(result) | NotLanded() | Unknown(reason)`` (sync or async)
    that asks the destination whether a call of unknown outcome happened."""
    reconcile_deadline: timedelta = timedelta(minutes=5)
    """Overall deadline of the probe (with its retries); past it the call is parked."""
    late_commit: timedelta = timedelta(0)
    """How long after the tool stopped waiting for a request (its own timeout) the provider
    may still make the effect. A probe's "not landed" leads to a re-run only once this much
    more has passed, and the probe has said it again (a request that commits late is then
    found landed, not sent twice)."""
    on_unknown: str = "wait"
    """``"wait"`` for the reconciliation's verdict, or ``"raise"`` AmbiguousOutcome at once."""
    budgets: tuple[Any, ...] = ()
    """``exactcall.Budget`` bounds across this tool's calls (reserved before each call)."""


@dataclass(eq=False)
class Tool:
    """A tool function wrapped by ``@exactcall.tool``. Call it through ``exactcall.call``."""

    fn: Callable[..., Any]
    options: ToolOptions
    _signature: inspect.Signature = field(init=False, repr=False)
    _hints: dict[str, Any] = field(init=False, repr=False)
    _adapters: dict[str, pydantic.TypeAdapter[Any]] = field(
        init=False, repr=False, default_factory=dict
    )
    _defaults: dict[str, JsonValue] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        sig = inspect.signature(self.fn)
        for p in sig.parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                raise TypeError(
                    f"exactcall tool {self.options.name!r}: *{p.name} is not supported; "
                    "arguments are recorded by name, so give each one a name"
                )
        self._signature = sig
        self._hints = _type_hints(self.fn, self.options.name)
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.options.name

    @property
    def version(self) -> str:
        return self.options.version

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def needs_approval(self, intent: Intent) -> bool:
        """Whether a call waits for a person: ``approval=True``, or the tool's policy says so."""
        rule = self.options.approval
        if rule is True or not rule:
            return bool(rule)
        try:
            return bool(rule(intent))
        except Exception as exc:
            raise ExactcallError(
                f"the approval policy of {self.name} raised {type(exc).__name__}: {exc}",
                tool=self.name,
                step=intent.step,
            ) from exc

    @property
    def attempt_reads(self) -> bool:
        """Whether an attempt runs the tool as a read (no claim, nothing recorded, errors
        retried). The workflow side goes by ``options.read_only`` alone, the declaration;
        an MCP tool of a trusted server may also read by its ``readOnlyHint``."""
        return self.options.read_only

    reads_by_hint = False
    """Whether a worker's hint may make this tool's attempts reads: an MCP tool declared
    ``read_only=None`` (see :attr:`attempt_reads`)."""

    @property
    def takes_key(self) -> bool:
        return KEY_PARAM in self._signature.parameters

    @property
    def params(self) -> Mapping[str, inspect.Parameter]:
        return {k: p for k, p in self._signature.parameters.items() if k != KEY_PARAM}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function (tests, scripts). No exactcall protection here, so it is
        refused inside a workflow, where the effect would run unguarded (and on replay)."""
        if workflow.in_workflow():
            raise InvalidCall(
                f"{self.name}(...) was called directly inside a workflow, which would run its "
                f"effect unguarded in workflow code; nothing was executed. Use "
                f"await exactcall.call({self.name}, ...) instead",
                tool=self.name,
            )
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<exactcall.tool {self.name} v{self.version}>"

    undo_tool: Tool | None = field(init=False, repr=False, default=None)
    """The tool that undoes a done call of this one (declared with :meth:`undo`)."""

    def undo(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Declare this tool's undo: ``@pay.undo`` over ``def refund(done: exactcall.Done,
        *, idempotency_key: str)``. The undo is an exactcall tool of its own (named
        ``"<tool>.undo"`` unless ``name=`` says otherwise) and takes the options of
        ``@exactcall.tool``; ``exactcall.saga()`` calls it for each done call to undo."""
        if self.options.read_only:
            raise TypeError(
                f"a read_only tool cannot declare an undo ({self.name!r} changes nothing)"
            )
        if self.undo_tool is not None:
            raise TypeError(f"{self.name!r} already has an undo: {self.undo_tool.name!r}")

        def wrap(f: Callable[..., Any]) -> Tool:
            from exactcall.undo._undo import UNDO_SUFFIX

            if options.get("read_only"):
                raise TypeError(f"the undo of {self.name!r} changes something: not read_only")
            params = [p for n, p in inspect.signature(f).parameters.items() if n != KEY_PARAM]
            if len(params) != 1:
                raise TypeError(
                    f"the undo of {self.name!r} takes one argument, the exactcall.Done being "
                    f"undone (and optionally idempotency_key); {f.__name__} takes "
                    f"{[p.name for p in params]}"
                )
            t = tool(**{"name": self.name + UNDO_SUFFIX, **options})(f)
            self.undo_tool = t
            return t

        return wrap(fn) if fn is not None else wrap

    # -- binding ------------------------------------------------------------------------
    def canonical_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Bind, validate and canonicalise a call's arguments; raise InvalidCall if they
        do not fit."""
        if KEY_PARAM in kwargs and self.takes_key:
            raise InvalidCall(
                f"{self.name}: {KEY_PARAM} is derived by exactcall and cannot be passed; "
                "choose the step with exactcall.call(..., key=...) instead",
                tool=self.name,
            )
        sig = self._signature.replace(parameters=list(self.params.values()))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidCall(
                f"{self.name}{sig}: {exc}", tool=self.name, signature=str(sig)
            ) from None
        bound.apply_defaults()
        out: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            param = self.params[name]
            if param.kind is param.VAR_KEYWORD:
                for k, v in value.items():
                    out[k] = self._canonical_value(k, v, None)
            else:
                out[name] = self._canonical_value(name, value, name)
        self._check_size(out)
        return out

    def _canonical_value(self, name: str, value: Any, hint_name: str | None) -> JsonValue:
        where = f"{self.name}() argument {name!r}"
        to_json_value(value, where)  # refuses NaN, bytes, arbitrary objects before validation
        adapter = self._adapter(hint_name) if hint_name else None
        if adapter is not None:
            try:
                value = adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                raise InvalidCall(
                    f"{where} does not fit its annotation: {_short(exc)}",
                    tool=self.name,
                    argument=name,
                ) from None
        return to_json_value(value, where)

    def _check_size(self, args: dict[str, JsonValue]) -> None:
        size = len(canonical_json(args))
        limit = self.options.max_args_bytes
        if size > limit:
            raise ArgumentsTooLarge(
                f"{self.name}: canonical arguments are {size} bytes, over the limit of {limit} "
                "bytes; pass a reference (an id, a URL) instead, or raise max_args_bytes= on "
                "the tool",
                tool=self.name,
                size=size,
                limit=limit,
            )

    def _adapter(self, name: str) -> pydantic.TypeAdapter[Any] | None:
        hint = self._hints.get(name)
        if hint is None or hint is Any:
            return None
        adapter = self._adapters.get(name)
        if adapter is None:
            adapter = pydantic.TypeAdapter(hint)
            self._adapters[name] = adapter
        return adapter

    def return_adapter(self) -> pydantic.TypeAdapter[Any] | None:
        """Validator of the tool's return annotation (recorded results are plain JSON)."""
        hint = self._hints.get("return")
        if hint is None or hint is Any or hint is type(None):
            return None
        adapter = self._adapters.get("return")
        if adapter is None:
            adapter = pydantic.TypeAdapter(hint)
            self._adapters["return"] = adapter
        return adapter

    def typed_result(self, value: Any) -> tuple[Any, bool]:
        """A recorded result (plain JSON) as the return annotation's type, and whether it
        fit; one that does not fit is returned as it is (False)."""
        adapter = self.return_adapter()
        if adapter is None:
            return value, True
        try:
            return adapter.validate_python(value), True
        except pydantic.ValidationError:
            return value, False

    def arguments_for_call(self, canonical: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Validated positional and keyword arguments for the function, from canonical args.

        Canonical args recorded by an older deploy may lack a parameter added since: one with
        a default gets it from Python (the same call, see :meth:`same_call`); one without is
        :class:`ArgumentsNoLongerFit`, raised before anything runs, as is a recorded value
        that the parameter's annotation now refuses."""
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        declared = self.params
        for name, param in declared.items():
            if param.kind is param.VAR_KEYWORD:
                continue
            if name not in canonical:
                if param.default is not param.empty and param.kind is not param.POSITIONAL_ONLY:
                    continue
                raise ArgumentsNoLongerFit(
                    f"{self.name}: the call's recorded arguments have no {name!r}, which the "
                    "tool now requires (a parameter added without a default, or renamed); "
                    "nothing was executed. Give the new parameter a default, so calls recorded "
                    "before the change keep running",
                    tool=self.name,
                    argument=name,
                )
            value = canonical[name]
            adapter = self._adapter(name)
            if adapter is not None:
                try:
                    value = adapter.validate_python(value)
                except pydantic.ValidationError as exc:
                    raise ArgumentsNoLongerFit(
                        f"{self.name}: the call's recorded {name}={value!r} no longer fits the "
                        f"parameter's annotation ({_short(exc)}); nothing was executed",
                        tool=self.name,
                        argument=name,
                    ) from None
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(value)
            else:
                keywords[name] = value
        for name, value in canonical.items():
            if name not in declared:
                keywords[name] = value
        return positional, keywords

    def hash(self, *args: Any, **kwargs: Any) -> str:
        """``exactcall.intent_hash`` of a call of this tool."""
        return args_hash(self.name, self.canonical_args(args, kwargs))

    # -- identity across a deploy ------------------------------------------------------------
    def same_call(self, recorded_hash: str | None, canonical: Mapping[str, Any]) -> bool:
        """Whether ``recorded_hash``, recorded for a call of this tool (by this code or an
        older one), names the call whose canonical arguments are ``canonical``.

        The rule: a call keeps its identity when its arguments are the same, or when the
        signature only gained parameters that the call leaves at their defaults (the older
        code recorded the call without them, and Python gives them their defaults). Anything
        else is another call: a value that differs, a parameter removed or renamed, or a
        default that changed under a parameter the call had."""
        if not isinstance(recorded_hash, str):
            return False
        if recorded_hash == args_hash(self.name, canonical):
            return True
        return recorded_hash in self.older_hashes(canonical)

    def older_hashes(self, canonical: Mapping[str, Any]) -> frozenset[str]:
        """The hashes this call had under older signatures that lacked some of the parameters
        it leaves at their defaults (empty when it leaves none at a default)."""
        defaults = self._canonical_defaults()
        at_default = [k for k, v in defaults.items() if k in canonical and canonical[k] == v]
        at_default = at_default[:_MAX_ADDED]
        out = set()
        for n in range(1, len(at_default) + 1):
            for dropped in itertools.combinations(at_default, n):
                rest = {k: v for k, v in canonical.items() if k not in dropped}
                out.add(args_hash(self.name, rest))
        return frozenset(out)

    def _canonical_defaults(self) -> dict[str, JsonValue]:
        """Each named parameter with a default: its default as canonical JSON (cached)."""
        if self._defaults is None:
            defaults: dict[str, JsonValue] = {}
            for name, p in self.params.items():
                if p.default is p.empty or p.kind is p.VAR_KEYWORD:
                    continue
                try:
                    defaults[name] = self._canonical_value(name, p.default, name)
                except ExactcallError:
                    continue  # a default that is not JSON (a sentinel) is never "left at it"
            self._defaults = defaults
        return self._defaults


def _type_hints(fn: Callable[..., Any], tool_name: str) -> dict[str, Any]:
    """The tool's resolved annotations; {} (arguments checked as JSON only) if one of them
    cannot be resolved, with a warning naming each such annotation and why."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        origin = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
        if (tool_name, origin) in _WARNED:  # the workflow sandbox re-imports tool modules
            return {}
        _WARNED.add((tool_name, origin))
        unresolved = _unresolved_annotations(fn) or {"?": f"{type(exc).__name__}: {exc}"}
        for name, error in unresolved.items():
            log.warning(
                "tool.annotations_unresolved",
                tool=tool_name,
                function=origin,
                annotation=name,
                annotation_text=str(_annotations(fn).get(name, "?")),
                error=error,
                consequence="no argument or result of this tool is validated against its "
                "annotations (checked as plain JSON only)",
                fix="define (or import) the annotation's type at module level in the tool's "
                "module, not inside a function or only under `if TYPE_CHECKING:`",
            )
        return {}


_WARNED: set[tuple[str, str]] = set()


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    return dict(getattr(inspect.unwrap(fn), "__annotations__", None) or {})


def _unresolved_annotations(fn: Callable[..., Any]) -> dict[str, str]:
    """Each annotation of ``fn`` that does not resolve on its own, with the error."""
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    out: dict[str, str] = {}
    for name, ann in _annotations(fn).items():

        def one() -> None: ...

        one.__annotations__ = {name: ann}
        try:
            typing.get_type_hints(one, globalns=globalns, include_extras=True)
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _short(exc: pydantic.ValidationError) -> str:
    errs = exc.errors(include_url=False)
    return "; ".join(f"{e['msg']} (got {e.get('input')!r})" for e in errs[:3])


# -- registry --------------------------------------------------------------------------------
_REGISTRY: dict[str, Tool] = {}
"""The first definition of each tool name in this process."""
_SAME_NAME: dict[str, dict[str, Tool]] = {}
"""name -> origin -> tool, for names that two apps of one process define (each worker then
lists its own with ``Plugin(tools=[...])``)."""

TOOL_SCOPE: contextvars.ContextVar[Mapping[str, Tool] | None] = contextvars.ContextVar(
    "exactcall_tool_scope", default=None
)
"""The tools of the worker running this workflow task, by name, when its plugin lists them
(``Plugin(tools=[...])``): a tool named by a string resolves to the worker's own."""


def _register(t: Tool) -> None:
    existing = _REGISTRY.get(t.name)
    if existing is None:
        _REGISTRY[t.name] = t
    elif _origin(existing) != _origin(t):  # the same origin: a module imported again
        _SAME_NAME.setdefault(t.name, {_origin(existing): existing}).setdefault(_origin(t), t)


def _origin(t: Tool) -> str:
    return f"{getattr(t.fn, '__module__', '?')}.{getattr(t.fn, '__qualname__', '?')}"


def registered_tools() -> list[Tool]:
    """Every tool defined so far in this process, by name (a name that two apps define
    appears once per definition)."""
    out = []
    for name in sorted(_REGISTRY):
        out += list(_SAME_NAME[name].values()) if name in _SAME_NAME else [_REGISTRY[name]]
    return out


def same_names(tools: Sequence[Tool]) -> dict[str, list[str]]:
    """Names that more than one of ``tools`` has: name -> the origins (module.function)."""
    by_name: dict[str, list[Tool]] = {}
    for t in tools:
        group = by_name.setdefault(t.name, [])
        if all(other is not t for other in group):
            group.append(t)
    return {n: sorted(_origin(t) for t in g) for n, g in by_name.items() if len(g) > 1}


def get_tool(name: str) -> Tool:
    scope = TOOL_SCOPE.get()
    if scope is not None and name in scope:
        return scope[name]
    if name in _SAME_NAME:
        origins = " and ".join(sorted(_SAME_NAME[name]))
        raise UnknownTool(
            f"two exactcall tools are named {name!r} ({origins}), so the name alone does not "
            "say which one: pass the tool object instead of its name, or list each worker's "
            "tools with exactcall.Plugin(tools=[...]), which makes a name mean that worker's",
            tool=name,
        )
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownTool(
            f"unknown tool {name!r}: no @exactcall.tool has that name (known: {known}); "
            "import the module that defines it",
            tool=name,
        ) from None


def resolve_tool(t: Tool | str | Any) -> Tool:
    if isinstance(t, Tool):
        return t
    if isinstance(t, str):
        return get_tool(t)
    raise UnknownTool(
        f"{t!r} is not an exactcall tool; decorate the function with @exactcall.tool",
        tool=getattr(t, "__name__", repr(t)),
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    version: str = "1",
    read_only: bool = False,
    provider_idempotent: bool | timedelta = False,
    task_queue: str | None = None,
    start_to_close_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    not_executed_on: Sequence[type[BaseException]] = (),
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
    approval: bool | Callable[[Any], bool] = False,
    approval_timeout: timedelta = DEFAULT_APPROVAL_TIMEOUT,
    approvers: Sequence[str] | None = None,
    min_approvals: int = 1,
    requester_may_approve: bool = True,
    reconcile: Callable[[Any], Any] | None = None,
    reconcile_deadline: timedelta = timedelta(minutes=5),
    late_commit: timedelta = timedelta(0),
    on_unknown: str = "wait",
    budgets: Sequence[Any] = (),
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a side-effecting (or, with ``read_only=True``, a read-only) tool.

    Used bare (``@exactcall.tool``) or with options (``@exactcall.tool(version="2")``).
    The function may be sync or async. It receives its idempotency key through an
    ``idempotency_key`` parameter if it declares one, or from ``exactcall.idempotency_key()``.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        t = Tool(f, _options(f, options))
        _register(t)
        return t

    return wrap(fn) if fn is not None else wrap


def _options(f: Callable[..., Any], options: dict[str, Any]) -> ToolOptions:
    opts = {k: v for k, v in options.items() if v is not None}
    opts.setdefault("name", f.__name__)
    opts["not_executed_on"] = tuple(opts.get("not_executed_on", ()))
    if not isinstance(opts["name"], str) or not opts["name"]:
        raise TypeError("exactcall.tool(name=...) must be a non-empty string")
    opts["version"] = str(opts.get("version", "1"))
    if "approvers" in opts:
        opts["approvers"] = frozenset(opts["approvers"])
    if opts.get("min_approvals", 1) < 1:
        raise TypeError("exactcall.tool(min_approvals=...) must be at least 1")
    if opts.get("on_unknown", "wait") not in ("wait", "raise"):
        raise TypeError("exactcall.tool(on_unknown=...) must be 'wait' or 'raise'")
    late = opts.get("late_commit", timedelta(0))
    if not isinstance(late, timedelta) or late < timedelta(0):
        raise TypeError(f"exactcall.tool(late_commit=...) must be a timedelta >= 0, not {late!r}")
    if opts.get("read_only") and opts.get("approval"):
        raise TypeError("a read_only tool cannot need approval (it changes nothing)")
    if "budgets" in opts:
        opts["budgets"] = _budgets(opts["name"], opts["budgets"], bool(opts.get("read_only")))
    return ToolOptions(**opts)


def _budgets(name: str, budgets: Any, read_only: bool) -> tuple[Any, ...]:
    from exactcall.budgets._budget import Budget

    out = tuple(budgets) if isinstance(budgets, list | tuple) else (budgets,)
    for b in out:
        if not isinstance(b, Budget):
            raise TypeError(
                f"exactcall.tool({name!r}, budgets=...): {b!r} is not an exactcall.Budget"
            )
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise TypeError(f"exactcall.tool({name!r}, budgets=...): a budget is listed twice")
    if out and read_only:
        raise TypeError(f"a read_only tool cannot have budgets ({name!r} changes nothing)")
    return out


def intent_hash(t: Tool | str, /, *args: Any, **kwargs: Any) -> str:
    """sha256 (hex) of the canonical JSON of the tool name and its bound arguments.

    ``intent_hash(pay, 10, "alice") == intent_hash(pay, to="alice", amount=10)``. The same
    value is in every intent, approval and log line of the call.
    """
    return resolve_tool(t).hash(*args, **kwargs)
