"""JSON schemas for strict structured output (OpenAI `strict: true`).

Strict mode accepts a subset of JSON Schema: every object lists all its properties in `required` and
sets `additionalProperties: false`. `strict_schema` returns a strict version of a schema when one exists
without changing what the schema accepts for agentrt's parsers, or `None`:

- `additionalProperties: false` is added to objects that do not say otherwise. This only forbids keys
  the declared type does not have (pydantic ignores such keys anyway), so the parsed value is the same.
- An optional property (missing from `required`), an open mapping (`additionalProperties` is a schema or
  `true`) or an object without `properties` cannot be expressed without changing the type, so such a
  schema is sent non-strict rather than rewritten: making a defaulted field required would make the
  model invent values the user never asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["strict_schema"]

_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties")
_SUBSCHEMAS = ("items", "not", "if", "then", "else", "contains")


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of `schema` valid for strict mode, or `None` when strictness would change its meaning."""
    try:
        strict: dict[str, Any] = _strict(schema)
    except _NotStrict:
        return None
    return strict


class _NotStrict(Exception):
    pass


def _strict(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return schema  # booleans and malformed parts are left to the server
    result: dict[str, Any] = dict(schema)
    is_object = schema.get("type") == "object" or "properties" in schema
    if is_object:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) and schema.get("additionalProperties") is not False:
            raise _NotStrict  # no declared properties: a free-form mapping
        if schema.get("additionalProperties", False) is not False or "patternProperties" in schema:
            raise _NotStrict
        required = schema.get("required", ())
        if isinstance(properties, Mapping) and set(properties) - set(required):
            raise _NotStrict
        result["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, Mapping):
            result[key] = {name: _strict(sub) for name, sub in value.items()}
    for key in _SUBSCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            result[key] = [_strict(sub) for sub in value]
    for key in _SUBSCHEMAS:
        if key in schema:
            result[key] = _strict(schema[key])
    return result
