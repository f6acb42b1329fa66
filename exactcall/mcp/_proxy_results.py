"""A person's verdict as the tool's result: ``exactcall resolve --landed --result VALUE``.

The call's workflow turns a plain VALUE into a ``tools/call`` result with VALUE as text and as
structured content (an object as it is, any other value as ``{"result": VALUE}``, the MCP
SDK's shape for a function's return value). A tool whose output schema wants another shape
(``{"content": string}``, say) would have its client reject that result, so before answering,
the proxy fits it to the schema it read from ``tools/list``: kept when the schema takes it,
else VALUE itself when the schema takes that, else ``{P: VALUE}`` for an object schema with one
property P. A result the server sent is never changed, nor one no fit makes valid.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit_to_schema"]


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
        from jsonschema.validators import validator_for

        return bool(validator_for(schema)(schema).is_valid(value))
    except Exception:  # no jsonschema, or a schema it cannot read: leave the result alone
        return False
