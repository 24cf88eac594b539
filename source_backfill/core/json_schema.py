"""A JSON Schema document as a record of columns, for the pin / evolve / fail rules (pure; issue 48).

Confluent's JSON Schema serializer frames a value as Avro's does (magic byte 0, the writer schema's id)
and writes the record as JSON text; the registry keeps the writer's JSON Schema under that id. A job
decodes such values onto its reader's columns by the same rules as Avro's
(:mod:`source_backfill.core.schema_evolution`), once each schema is read as a :class:`Record`:

* the top level is ``{"type": "object", "properties": {...}}``; each property is a field, in the
  document's order (a JSON object's order is its text's);
* ``string`` → ``string``, ``integer`` → ``long``, ``number`` → ``double``, ``boolean`` → ``boolean``
  (so a property widened from ``integer`` to ``number`` is Avro's ``long`` → ``double`` promotion);
* a property is nullable when it is not ``required``, or when its type admits ``null`` (``["string",
  "null"]``, or ``oneOf`` / ``anyOf`` of ``{"type": "null"}`` and one other type);
* its ``default`` is the field's default; a nullable property without one defaults to null (an optional
  property absent from a record is null).

What a column cannot hold is refused with the property named, not guessed at: nested objects, arrays,
``$ref``, a type union of two non-null types, a property schema of ``true``. Keywords that only constrain
values (``format``, ``minimum``, ``pattern``, ``description``...) are ignored: the producer's serializer
validates by them, the columns do not change. ``additionalProperties`` is ignored too: a property the
reader lacks is skipped, as Avro's resolution skips a field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from source_backfill.core.schema_evolution import Field, Record
from source_backfill.errors import SchemaChangeError

#: JSON Schema's scalar types and the record field type each becomes.
TYPES: Mapping[str, str] = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}
#: The other way, for a record written out as JSON Schema (tests, examples).
JSON_TYPES: Mapping[str, str] = {v: k for k, v in TYPES.items()} | {"int": "integer", "float": "number"}


def parse_json_schema(schema: str | Mapping[str, Any]) -> Record:
    """A :class:`Record` from a JSON Schema document (text or parsed); SchemaChangeError out of scope."""
    try:
        raw = json.loads(schema) if isinstance(schema, str) else schema
    except ValueError as exc:
        msg = f"the JSON Schema is not JSON: {exc}"
        raise SchemaChangeError(msg) from exc
    if not isinstance(raw, Mapping) or raw.get("type") != "object" or not isinstance(
            raw.get("properties", {}), Mapping):
        msg = 'only object schemas are decoded into columns (the top level must be {"type": "object"})'
        raise SchemaChangeError(msg)
    required = raw.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        msg = "the schema's required is not a list of property names"
        raise SchemaChangeError(msg)
    name = str(raw.get("title") or "record")
    fields = []
    for prop, spec in raw.get("properties", {}).items():
        kind, nullable = _property_type(prop, spec)  # spec is a mapping from here on
        nullable = nullable or prop not in required
        if "default" in spec:
            fields.append(Field(prop, kind, nullable, spec["default"]))
        else:  # an optional property absent is null: its default
            fields.append(Field(prop, kind, nullable, None) if nullable else Field(prop, kind))
    return Record(name, tuple(fields))


def _property_type(name: str, spec: Any) -> tuple[str, bool]:
    """(field type, nullable by its type) of a property's schema; SchemaChangeError when out of scope."""
    if not isinstance(spec, Mapping):
        msg = f'property "{name}": a schema of {json.dumps(spec)} says no type: give it one'
        raise SchemaChangeError(msg)
    if "$ref" in spec:
        msg = f'property "{name}": $ref is not decoded into a column (inline its type)'
        raise SchemaChangeError(msg)
    branches = spec.get("oneOf") or spec.get("anyOf")
    if branches is not None:
        if not isinstance(branches, list):
            msg = f'property "{name}": oneOf/anyOf must list schemas'
            raise SchemaChangeError(msg)
        kinds = [b.get("type") if isinstance(b, Mapping) else None for b in branches]
    else:
        kind = spec.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
    others = [k for k in kinds if k != "null"]
    kind = others[0] if len(others) == 1 else None
    if not isinstance(kind, str) or kind not in TYPES:
        what = " or ".join(str(k) for k in others) or "null only"
        msg = (f'property "{name}": type {what} is not a column type (string, integer, number or boolean, '
               "optionally with null)")
        raise SchemaChangeError(msg)
    return TYPES[kind], "null" in kinds


def to_json_schema(record: Record) -> dict[str, Any]:
    """``record`` as the JSON Schema :func:`parse_json_schema` reads back as it.

    A nullable field is an optional property whose type admits null.
    """
    props: dict[str, Any] = {}
    for f in record.fields:
        kind = JSON_TYPES[f.type]
        prop: dict[str, Any] = {"type": [kind, "null"] if f.nullable else kind}
        if f.has_default:
            prop["default"] = f.default
        props[f.name] = prop
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": record.name, "type": "object",
            "properties": props, "required": [f.name for f in record.fields if not f.nullable]}
