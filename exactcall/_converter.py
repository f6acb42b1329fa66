"""exactcall's payloads under any data converter.

exactcall's own values (intents, records, verdicts, approvals) are pydantic models. Rather
than replace the client's payload converter with the pydantic one (which changes the bytes of
every workflow's payloads: it does not sort keys) or refuse a converter that cannot carry
them, the plugin wraps the client's payload converter: pydantic models, and values decoded into
a type that names one, are pydantic JSON (``json/plain``, the bytes the pydantic converter
writes, so histories and mixed fleets read either way); every other value goes to the client's
own converter, untouched (a value holding a model in a dict or list is pydantic JSON as a
whole). Codecs and failure converters apply as before.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import PayloadConverter, SerializationContext, WithSerializationContext

__all__ = ["ModelsAsPydantic", "models_as_pydantic"]

_JSON = b"json/plain"


class ModelsAsPydantic(PayloadConverter, WithSerializationContext):
    """The client's payload converter, with pydantic models in pydantic JSON (see module)."""

    inner_class: ClassVar[type[PayloadConverter]]
    """The client's payload converter class (set on each subclass, by models_as_pydantic)."""

    def __init__(self, inner: PayloadConverter | None = None) -> None:
        self.inner = inner if inner is not None else self.inner_class()
        self._pydantic = PydanticJSONPlainPayloadConverter()

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        out: list[Payload] = []
        for value in values:
            if _is_model(value):
                payload = self._pydantic.to_payload(value)
                assert payload is not None  # pydantic JSON takes every model
                out.append(payload)
            else:
                out.extend(self.inner.to_payloads([value]))
        return out

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        out: list[Any] = []
        for i, payload in enumerate(payloads):
            hint = type_hints[i] if type_hints else None
            if (
                hint is not None
                and _names_a_model(hint)
                and payload.metadata.get("encoding") == _JSON
            ):
                out.append(self._pydantic.from_payload(payload, hint))
            else:
                out.extend(self.inner.from_payloads([payload], [hint] if hint else None))
        return out

    def with_context(self, context: SerializationContext) -> ModelsAsPydantic:
        if not isinstance(self.inner, WithSerializationContext):
            return self
        inner = self.inner.with_context(context)
        return self if inner is self.inner else type(self)(inner)


@functools.cache
def models_as_pydantic(inner: type[PayloadConverter]) -> type[ModelsAsPydantic]:
    """The payload converter class exactcall gives a client whose class is ``inner`` (one
    class per ``inner``, so two clients of one converter compare equal)."""
    if issubclass(inner, ModelsAsPydantic):
        return inner
    name = f"ModelsAsPydantic[{inner.__qualname__}]"
    return type(name, (ModelsAsPydantic,), {"inner_class": inner, "__module__": __name__})


def _is_model(value: Any, depth: int = 0) -> bool:
    """Whether a value is, or holds (in dicts, lists and tuples), a pydantic model: such a value
    is pydantic JSON, as it was under the pydantic converter exactcall 0.1 installed (a graph
    state of LangChain messages, say); any other value is the client's converter's."""
    if isinstance(value, BaseModel):
        return True
    if depth > _DEPTH or isinstance(value, str | bytes | int | float | bool | RawValue):
        return False
    if isinstance(value, dict):
        return any(_is_model(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_is_model(v, depth + 1) for v in value)
    return False


_DEPTH = 8


def _names_a_model(hint: Any) -> bool:
    """Whether a type hint is (or holds, as in ``Settled | None`` or ``list[Decision]``) a
    pydantic model."""
    try:
        return _names_a_model_cached(hint)
    except TypeError:  # not hashable: look without the cache
        return _look(hint)


@functools.lru_cache(maxsize=1024)
def _names_a_model_cached(hint: Any) -> bool:
    return _look(hint)


def _look(hint: Any) -> bool:
    if typing.get_origin(hint) is not None or isinstance(hint, types.UnionType):
        return any(_look(a) for a in typing.get_args(hint))
    return isinstance(hint, type) and issubclass(hint, BaseModel)
