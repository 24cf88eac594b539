"""What a new writer schema does to a job's decoded columns: pin, evolve or fail (pure; issue 48's rules).

Records in the Confluent wire format carry the id of the schema they were written with (their **writer**
schema). A job decodes every record by its own writer schema and lands it in columns of one **reader**
schema, the job's: the subject's latest version when the job was created, or one it names. When a writer
schema differs from the reader's, the job's policy says what happens:

``pin``
    The reader schema stays. Each record is resolved onto it by Avro's rules (:func:`resolve`): a field
    both have is read, promoted if the writer's type is narrower (``int`` → ``long`` → ``float`` →
    ``double``, ``string`` ↔ ``bytes``); a reader field the writer lacks takes its default (none: the
    writer is incompatible); a writer field the reader lacks is skipped.
``evolve``
    The reader schema follows the writer (:func:`evolve`): a new writer field is appended as a nullable
    column (older rows hold null, or the field's default), a field whose type the writer widened is
    widened, a field the writer dropped stays (its new rows take its default or null). Only additive,
    nullable changes reach the table, so every row already written stays valid under the new schema.
``fail``
    Any writer schema whose fields differ from the reader's fails the job (:func:`check_same`).

Whatever the policy, a change no rule allows (a type changed other than by widening, a reader field
without a default the writer lacks under ``pin``) fails that job alone, naming the field and both types.

Scope: records of primitive fields, each optionally nullable (a union of ``null`` and one type), as
most topics are. Nested records, arrays, maps, enums, fixed and logical types are refused by
:func:`parse` with the field named, rather than guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from source_backfill.errors import SchemaChangeError

PRIMITIVES = ("boolean", "int", "long", "float", "double", "bytes", "string")

#: Avro's promotions: a value written as the key is read as any of its values (the spec's resolution).
PROMOTES: Mapping[str, tuple[str, ...]] = {
    "int": ("long", "float", "double"),
    "long": ("float", "double"),
    "float": ("double",),
    "string": ("bytes",),
    "bytes": ("string",),
}

_NO_DEFAULT = object()


@dataclass(frozen=True)
class Field:
    """One field of a record: its primitive type, whether it is nullable, and its default if any."""

    name: str
    type: str
    nullable: bool = False
    default: Any = _NO_DEFAULT

    @property
    def has_default(self) -> bool:
        """Whether the field names a default (``None`` is a default: null)."""
        return self.default is not _NO_DEFAULT

    def avro(self) -> dict[str, Any]:
        """The field as Avro's JSON names it.

        A nullable one is ``["null", type]``, or ``[type, "null"]`` when its default is not null (a union's
        default is of its first branch).
        """
        kind: Any = self.type
        if self.nullable:
            first_null = not self.has_default or self.default is None
            kind = ["null", self.type] if first_null else [self.type, "null"]
        out: dict[str, Any] = {"name": self.name, "type": kind}
        if self.has_default:
            out["default"] = self.default
        return out


@dataclass(frozen=True)
class Record:
    """A record schema: its full name and fields, in order."""

    name: str
    fields: tuple[Field, ...] = field(default_factory=tuple)

    def get(self, name: str) -> Field | None:
        """The field named ``name``, None when the record has none."""
        return next((f for f in self.fields if f.name == name), None)

    def avro(self) -> dict[str, Any]:
        """The record as Avro's JSON (what a registry stores and fastavro parses)."""
        return {"type": "record", "name": self.name, "fields": [f.avro() for f in self.fields]}


def parse(schema: str | Mapping[str, Any]) -> Record:
    """A :class:`Record` from Avro's JSON (a string or parsed); SchemaChangeError for what is out of scope."""
    raw = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(raw, Mapping) or raw.get("type") != "record":
        msg = "only record schemas are decoded into columns (the top level must be {\"type\": \"record\"})"
        raise SchemaChangeError(msg)
    namespace = raw.get("namespace")
    name = str(raw.get("name", ""))
    full = f"{namespace}.{name}" if namespace and "." not in name else name
    fields = []
    for item in raw.get("fields", ()):
        fname = str(item.get("name", ""))
        kind, nullable = _field_type(fname, item.get("type"))
        default = item["default"] if "default" in item else _NO_DEFAULT
        fields.append(Field(fname, kind, nullable, default))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        msg = f"record {full} names a field twice"
        raise SchemaChangeError(msg)
    return Record(full, tuple(fields))


def _field_type(name: str, kind: Any) -> tuple[str, bool]:
    """(primitive type, nullable) of a field's Avro type; SchemaChangeError when out of scope."""
    if isinstance(kind, str) and kind in PRIMITIVES:
        return kind, False
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(kind) == len(others) + 1 and len(others) == 1 and others[0] in PRIMITIVES:
            return str(others[0]), True
    msg = (f"field {name!r}: type {json.dumps(kind)} is not decoded yet (a primitive, or a union of null "
           f"and one primitive: {', '.join(PRIMITIVES)})")
    raise SchemaChangeError(msg)


def promotes(writer: str, reader: str) -> bool:
    """Whether a value written as ``writer`` is read as ``reader`` (the same type, or a promotion)."""
    return writer == reader or reader in PROMOTES.get(writer, ())


@dataclass(frozen=True)
class Resolution:
    """How records of a writer schema land in the reader's fields, field by field in the reader's order.

    ``read``: reader field → the writer field it is read from (promoted when the types differ);
    ``filled``: reader field → the default it takes (the writer lacks it); ``skipped``: writer fields the
    reader has no column for.
    """

    reader: Record
    read: Mapping[str, str]
    filled: Mapping[str, Any]
    skipped: tuple[str, ...]

    def project(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """One decoded writer record as the reader's row (promoted values, defaults filled)."""
        out: dict[str, Any] = {}
        for f in self.reader.fields:
            if f.name in self.read:
                out[f.name] = _promoted(record[self.read[f.name]], f.type)
            else:
                out[f.name] = self.filled[f.name]
        return out


def _promoted(value: Any, reader_type: str) -> Any:
    if value is None:
        return None
    if reader_type in ("float", "double") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if reader_type == "bytes" and isinstance(value, str):
        return value.encode()
    if reader_type == "string" and isinstance(value, bytes):
        return value.decode()
    return value


def resolve(reader: Record, writer: Record) -> Resolution:
    """``pin``: records of ``writer`` read as ``reader`` (Avro's resolution), or SchemaChangeError."""
    read: dict[str, str] = {}
    filled: dict[str, Any] = {}
    for r in reader.fields:
        w = writer.get(r.name)
        if w is None:
            if not r.has_default:
                msg = (f"field {r.name!r} of {reader.name} has no default and writer schema {writer.name} "
                       "lacks it: pin cannot fill it")
                raise SchemaChangeError(msg)
            filled[r.name] = r.default
            continue
        if not promotes(w.type, r.type):
            msg = f"field {r.name!r}: written as {w.type}, read as {r.type}: not a promotion Avro allows"
            raise SchemaChangeError(msg)
        if w.nullable and not r.nullable:
            msg = f"field {r.name!r}: the writer's may be null, the reader's may not"
            raise SchemaChangeError(msg)
        read[r.name] = w.name
    skipped = tuple(w.name for w in writer.fields if reader.get(w.name) is None)
    return Resolution(reader, read, filled, skipped)


@dataclass(frozen=True)
class Evolution:
    """``evolve``: the reader schema after a writer schema, and what changed (for the log and the table).

    ``added``: new fields (nullable, appended); ``widened``: field → (old type, new type); ``dropped``:
    fields the writer no longer has (kept; nullable from now on unless they have a default).
    """

    reader: Record
    added: tuple[str, ...]
    widened: Mapping[str, tuple[str, str]]
    dropped: tuple[str, ...]


def evolve(reader: Record, writer: Record) -> Evolution:
    """``evolve``: the reader grown to take ``writer``'s records and keep every row written before.

    Every older writer still resolves onto the result (:func:`resolve`): a dropped field keeps its
    default or becomes nullable with a null default, an added one is nullable with its default (or
    null), a widened one reads the narrower values by promotion.
    """
    fields: list[Field] = []
    widened: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    for r in reader.fields:
        w = writer.get(r.name)
        if w is None:
            dropped.append(r.name)
            fields.append(r if r.has_default else Field(r.name, r.type, True, None))
            continue
        kind = r.type
        if w.type != r.type:
            if promotes(r.type, w.type) and not _lossy_widening(r.type, w.type):
                kind = w.type
                widened[r.name] = (r.type, w.type)
            elif promotes(w.type, r.type):
                kind = r.type  # the writer narrowed it: its values promote to the column's type
            else:
                msg = (f"field {r.name!r}: {r.type} in the table, {w.type} in the new writer schema: "
                       "not a widening")
                raise SchemaChangeError(msg)
        fields.append(Field(r.name, kind, r.nullable or w.nullable, r.default))
    added = []
    for w in writer.fields:
        if reader.get(w.name) is None:
            added.append(w.name)
            fields.append(Field(w.name, w.type, True, None))
    return Evolution(Record(reader.name, tuple(fields)), tuple(added), widened, tuple(dropped))


def _lossy_widening(old: str, new: str) -> bool:
    """Whether a promotion would change rows already written.

    bytes ↔ string is a reading rule, not a widening of a column (the column keeps its type; values
    promote when read).
    """
    return {old, new} == {"bytes", "string"}


def check_same(reader: Record, writer: Record) -> None:
    """``fail``: SchemaChangeError unless ``writer`` has the reader's fields, types and nullability."""
    rf = [(f.name, f.type, f.nullable) for f in reader.fields]
    wf = [(f.name, f.type, f.nullable) for f in writer.fields]
    if sorted(rf) == sorted(wf):
        return
    only_reader = sorted({n for n, *_ in rf} - {n for n, *_ in wf})
    only_writer = sorted({n for n, *_ in wf} - {n for n, *_ in rf})
    changed = sorted(n for n, t, z in rf if any(n == m and (t, z) != (u, y) for m, u, y in wf))
    msg = (f"writer schema {writer.name} differs from the job's ({reader.name}) and the job's policy is "
           f"fail: only in the job's: {only_reader or 'none'}; only in the writer's: "
           f"{only_writer or 'none'}; changed: {changed or 'none'}")
    raise SchemaChangeError(msg)

