"""The results the proxy answers with besides the server's: a person's verdict as the tool's
result (``exactcall resolve --landed --result VALUE``), and the proxy's own tool errors.

The call's workflow turns a plain VALUE into a ``tools/call`` result with VALUE as text and as
structured content (an object as it is, any other value as ``{"result": VALUE}``, the MCP
SDK's shape for a function's return value). A tool whose output schema wants another shape
(``{"content": string}``, say) would have its client reject that result, so before answering,
the proxy fits it to the schema it read from ``tools/list``: kept when the schema takes it,
else VALUE itself when the schema takes that, else ``{P: VALUE}`` for an object schema with one
property P. A result the server sent is never changed, nor one no fit makes valid.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

__all__ = ["OUTCOME_META", "as_result", "clock", "fit_to_schema", "tool_error"]

OUTCOME_META = "io.exactcall/outcome"


def fit_to_schema(result: dict[str, Any], schema: Any) -> dict[str, Any]:
    """``result`` (a settled call's), with its structured content fitted to ``schema``."""
    if not isinstance(schema, dict) or "structuredContent" not in result:
        return result
    given = result["structuredContent"]
    if _valid(given, schema):
        return result
    value = given["result"] if isinstance(given, dict) and set(given) == {"result"} else given
    props = schema.get("properties")
    one = [next(iter(props))] if isinstance(props, dict) and len(props) == 1 else []
    for candidate in [value, *({p: value} for p in one)]:
        if _valid(candidate, schema):
            return {**result, "structuredContent": candidate}
    return result


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    try:
        from jsonschema.validators import validator_for  # type: ignore[import-untyped]

        return bool(validator_for(schema)(schema).is_valid(value))
    except Exception:  # no jsonschema, or a schema it cannot read: leave the result alone
        return False


def as_result(value: Any, by: str) -> dict[str, Any]:
    """The result of a call settled as landed: a re-run's result, or a person's ``--result
    JSON``, either a whole tools/call result (``{"content": [...]}``) or a JSON value, sent as
    text and as structured content (an object as it is, any other value as ``{"result": v}``,
    the MCP SDK's shape)."""
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return value
    result: dict[str, Any] = {"isError": False, "resultType": "complete"}
    if value is None:
        text = f"the call landed ({by}); no result was recorded"
    else:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        result["structuredContent"] = value if isinstance(value, dict) else {"result": value}
    return {"content": [{"type": "text", "text": text}], **result}


def clock(at: str | None) -> str:
    """``2026-12-02T19:03:04+00:00`` -> ``19:03:04 UTC`` (the day too when it is not today)."""
    if at is None:
        return "earlier"
    try:
        t = datetime.fromisoformat(at)
    except ValueError:
        return at
    today = datetime.now(t.tzinfo).date() == t.date()
    return t.strftime("%H:%M:%S UTC" if today else "%Y-%m-%d %H:%M:%S UTC")


def tool_error(
    text: str,
    outcome: str,
    workflow_id: str | None = None,
    step: str | None = None,
    args_hash: str | None = None,
) -> dict[str, Any]:
    """An MCP tool error result from the proxy itself."""
    meta = {OUTCOME_META: outcome}
    for k, v in (("workflow-id", workflow_id), ("step", step), ("args-hash", args_hash)):
        if v is not None:
            meta[f"io.exactcall/{k}"] = v
    return {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "resultType": "complete",
        "_meta": meta,
    }
