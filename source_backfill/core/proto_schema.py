"""A Protobuf schema (a ``.proto`` file, proto3) as a record of columns, for the pin / evolve / fail rules.

Pure: no I/O, no protobuf library (the decoder, :mod:`connectors.schema_registry.decode_protobuf`, builds
its message classes from what this module reads). Confluent's Protobuf serializer frames a value as Avro's
does (magic byte 0, the writer schema's id), then writes the *message indexes* naming which message of the
file the record is (:func:`split_indexes`), then the message's bytes; the registry keeps the writer's
``.proto`` text under the id. A job decodes such values onto its reader's columns by the rules of
:mod:`source_backfill.core.schema_evolution`, once each file's first message is read as a :class:`Record`:

* a field ``name`` of a scalar type is the column ``name``: ``double``, ``float``, ``bool``, ``string``,
  ``bytes`` as themselves; ``int32``, ``sint32``, ``sfixed32`` → ``int``; ``int64``, ``sint64``,
  ``sfixed64``, ``uint32``, ``fixed32`` → ``long`` (a ``uint32`` may pass ``int``'s range);
* a field without a label (proto3's implicit presence) is not nullable and defaults to its type's zero
  (``0``, ``""``, ``false``): a record that leaves it out means zero, as every Protobuf reader says;
  an ``optional`` field is nullable and defaults to null (absent is null);
* columns are matched by name, as Avro's are: a field renamed is one dropped and one added (Protobuf's
  own compatibility is by field number; a number reused for another field is decoded by its writer
  schema, so each record is still read as it was written).

Only what a column holds is read; the rest is refused naming the field, never guessed at: ``repeated``,
``map<...>``, ``oneof``, message and enum types, ``uint64`` / ``fixed64`` (past a signed 64-bit column),
proto2 files (``required``, groups and defaults other than zero). Nested and top-level ``enum``,
``service`` and message declarations no field uses, imports and options are read past.

The job decodes the file's **first** message (Confluent's message index ``[0]``, what a serializer of a
file's single message writes): a record naming another message of the file is undecodable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from source_backfill.core.schema_evolution import Field, Record
from source_backfill.core.varint import varint, zigzag
from source_backfill.errors import SchemaChangeError

#: Protobuf's scalar types and the record field type each becomes.
TYPES = {
    "double": "double", "float": "float", "bool": "boolean", "string": "string", "bytes": "bytes",
    "int32": "int", "sint32": "int", "sfixed32": "int",
    "int64": "long", "sint64": "long", "sfixed64": "long", "uint32": "long", "fixed32": "long",
}
#: The zero value of each record field type: a proto3 field's default.
ZEROS = {"double": 0.0, "float": 0.0, "boolean": False, "string": "", "bytes": "", "int": 0, "long": 0}
#: Scalar types that do not fit a column, and why.
REFUSED = {"uint64": "its values pass a signed 64-bit column", "fixed64": "its values pass a signed 64-bit "
           "column", "group": "proto2 groups are not decoded"}
#: Field numbers Protobuf allows (19000-19999 are its own).
MAX_NUMBER = 2**29 - 1

_TOKEN = re.compile(r"""
    (?P<space>\s+) | (?P<line>//[^\n]*) | (?P<block>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|\.[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?))
  | (?P<symbol>[{}\[\]()<>;=,:])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class ProtoField:
    """One field of a message: its name, number, Protobuf scalar type and whether it is ``optional``."""

    name: str
    number: int
    type: str
    optional: bool = False

    def field(self) -> Field:
        """The field as a record's column (see the module for the types and defaults)."""
        kind = TYPES[self.type]
        return Field(self.name, kind, True, None) if self.optional else Field(self.name, kind, False,
                                                                             ZEROS[kind])


@dataclass(frozen=True)
class ProtoMessage:
    """A message of a ``.proto`` file: its package, name and scalar fields, in the file's order."""

    package: str
    name: str
    fields: tuple[ProtoField, ...]

    @property
    def full_name(self) -> str:
        """``package.Name`` (the name a descriptor pool knows it by)."""
        return f"{self.package}.{self.name}" if self.package else self.name

    def record(self) -> Record:
        """The message as a record of columns."""
        return Record(self.full_name, tuple(f.field() for f in self.fields))


def parse_proto(text: str) -> Record:
    """The first message of a ``.proto`` file as a :class:`Record`; SchemaChangeError when out of scope."""
    return first_message(text).record()


def first_message(text: str) -> ProtoMessage:
    """The first top-level message of a proto3 ``.proto`` file (Confluent's message index ``[0]``)."""
    tokens = _Tokens(text)
    package = ""
    syntax = None
    first: ProtoMessage | None = None
    while not tokens.done():
        word = tokens.next()
        if word == "syntax" or word == "edition":
            tokens.expect("=")
            syntax = tokens.next().strip("\"'")
            tokens.expect(";")
            if word == "edition" or syntax != "proto3":
                msg = (f"{word} {syntax!r}: only proto3 files are decoded (proto2's required fields and "
                       "non-zero defaults do not map onto columns)")
                raise SchemaChangeError(msg)
        elif word == "package":
            package = tokens.next()
            tokens.expect(";")
        elif word in ("import", "option"):
            tokens.skip_statement()
        elif word == "message":
            name = tokens.next()
            if first is None:
                if syntax is None:
                    msg = 'the file names no syntax (proto2 by default): only syntax = "proto3" is decoded'
                    raise SchemaChangeError(msg)
                first = ProtoMessage(package, name, _message_body(tokens, name))
            else:
                tokens.skip_block()
        elif word in ("enum", "service", "extend"):
            tokens.next()
            tokens.skip_block()
        elif word == ";":
            continue
        else:
            msg = f"the .proto file has {word!r} where a declaration starts"
            raise SchemaChangeError(msg)
    if first is None:
        msg = "the .proto file declares no message"
        raise SchemaChangeError(msg)
    return first


def _message_body(tokens: _Tokens, message: str) -> tuple[ProtoField, ...]:
    tokens.expect("{")
    fields: list[ProtoField] = []
    while (word := tokens.next()) != "}":
        if word in ("message", "enum"):
            tokens.next()
            tokens.skip_block()
        elif word in ("option", "reserved", "extensions"):
            tokens.skip_statement()
        elif word == ";":
            continue
        elif word in ("oneof", "map", "repeated", "required", "extend"):
            name = tokens.next()
            what = {"map": "a map", "repeated": "a repeated field", "required": "a proto2 required field",
                    "oneof": "a oneof", "extend": "an extension"}[word]
            msg = (f"message {message}: {what} ({word} {name}...) does not map onto a column: only scalar "
                   "fields, optional or not, are decoded")
            raise SchemaChangeError(msg)
        else:
            optional = word == "optional"
            kind = tokens.next() if optional else word
            fields.append(_field(tokens, message, kind, optional))
    names = [f.name for f in fields]
    numbers = [f.number for f in fields]
    if len(set(names)) != len(names) or len(set(numbers)) != len(numbers):
        msg = f"message {message} names a field or a field number twice"
        raise SchemaChangeError(msg)
    return tuple(fields)


def _field(tokens: _Tokens, message: str, kind: str, optional: bool) -> ProtoField:
    name = tokens.next()
    tokens.expect("=")
    number = tokens.next()
    if kind not in TYPES:
        why = REFUSED.get(kind, "a message or enum type is not a column (only scalar types: "
                          + ", ".join(TYPES) + ")")
        msg = f"message {message}, field {name!r}: type {kind}: {why}"
        raise SchemaChangeError(msg)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        msg = f"message {message}: {name!r} is not a field name"
        raise SchemaChangeError(msg)
    try:
        value = int(number, 0)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_NUMBER or 19000 <= value <= 19999:
        msg = f"message {message}, field {name!r}: {number} is not a field number"
        raise SchemaChangeError(msg)
    word = tokens.next()
    if word == "[":
        tokens.skip_until("]")
        word = tokens.next()
    if word != ";":
        msg = f"message {message}, field {name!r}: {word!r} where a ';' ends the field"
        raise SchemaChangeError(msg)
    return ProtoField(name, value, kind, optional)


class _Tokens:
    """The tokens of a ``.proto`` text, comments and spaces dropped."""

    def __init__(self, text: str) -> None:
        self._items = list(self._scan(text))
        self._at = 0

    @staticmethod
    def _scan(text: str) -> Iterator[str]:
        at = 0
        while at < len(text):
            match = _TOKEN.match(text, at)
            if match is None:
                msg = f"the .proto file has {text[at:at + 20]!r} at character {at}, which is not a token"
                raise SchemaChangeError(msg)
            at = match.end()
            if match.lastgroup not in ("space", "line", "block"):
                yield match.group()

    def done(self) -> bool:
        return self._at >= len(self._items)

    def next(self) -> str:
        if self.done():
            msg = "the .proto file ends inside a declaration"
            raise SchemaChangeError(msg)
        self._at += 1
        return self._items[self._at - 1]

    def expect(self, token: str) -> None:
        got = self.next()
        if got != token:
            msg = f"the .proto file has {got!r} where {token!r} was expected"
            raise SchemaChangeError(msg)

    def skip_until(self, close: str) -> None:
        """Past the ``close`` token that matches one already read (``]`` or ``}``), nesting counted."""
        opening = {"]": "[", "}": "{", ")": "(", ">": "<"}[close]
        depth = 1
        while depth:
            token = self.next()
            depth += (token == opening) - (token == close)

    def skip_block(self) -> None:
        """Past a ``{ ... }`` block, whatever it holds."""
        self.expect("{")
        self.skip_until("}")

    def skip_statement(self) -> None:
        """Past the next ``;`` (an option, import or reserved statement; its values may hold brackets)."""
        while (word := self.next()) != ";":
            if word in ("{", "["):
                self.skip_until("}" if word == "{" else "]")


def split_indexes(body: bytes | memoryview) -> tuple[tuple[int, ...], int]:
    """(message indexes, where the message starts) of a Confluent Protobuf body (after the 5-byte header).

    A zigzag varint count, then that many zigzag varints; a count of 0 (one byte ``0x00``) is ``[0]``,
    the file's first message. ValueError for a body that ends inside them or a count past the body.
    """
    view = memoryview(body)
    count, at = _zigzag(view, 0)
    if count == 0:
        return (0,), at
    if count < 0 or count > len(view):
        msg = f"message index count {count} does not fit a body of {len(view)} bytes"
        raise ValueError(msg)
    out = []
    for _ in range(count):
        value, at = _zigzag(view, at)
        out.append(value)
    return tuple(out), at


def _zigzag(view: memoryview, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(view) or shift > 63:
            msg = "the body ends inside its message indexes"
            raise ValueError(msg)
        byte = view[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at


def zigzag_indexes(indexes: tuple[int, ...]) -> bytes:
    """The message-index bytes a Confluent serializer writes for ``indexes`` (``[0]`` is one ``0x00``)."""
    if indexes == (0,):
        return b"\x00"
    return b"".join(varint(zigzag(value)) for value in (len(indexes), *indexes))


def render_proto(message: ProtoMessage) -> str:
    """``message`` as a proto3 file :func:`first_message` reads back as it (tests, examples, the demo)."""
    lines = ['syntax = "proto3";']
    if message.package:
        lines.append(f"package {message.package};")
    lines.append(f"message {message.name} {{")
    lines += [f"  {'optional ' if f.optional else ''}{f.type} {f.name} = {f.number};" for f in message.fields]
    lines.append("}")
    return "\n".join(lines) + "\n"
