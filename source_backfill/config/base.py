"""What every section of the configuration model shares: its frozen base model, names, "off" values."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

if TYPE_CHECKING:
    pass


#: Names of sources and jobs appear in paths, metric labels and URLs.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]

#: A transform starts with SELECT or WITH (any case) and reads ``{source}``. Checked by JobSpec's validator
#: (which says which half is missing) and published in the API schema, so clients and fuzzers see the rule.
#: Spelled out in ASCII (no ``\s``, ``\b``): Python's and JavaScript's regexes differ on what those match.
_TRANSFORM_START = r"^[ \t\n\r\f\v]*(?:[Ss][Ee][Ll][Ee][Cc][Tt]|[Ww][Ii][Tt][Hh])(?![A-Za-z0-9_])"
TRANSFORM_PATTERN = _TRANSFORM_START + r"[\s\S]*\{source\}"
#: The longest transform accepted (the transform check refuses longer ones before parsing them too).
MAX_TRANSFORM_CHARS = 16_384

#: A transform's text as the schema states it (``JobSpec``'s validator says which rule a text breaks).
TransformText = Annotated[str, Field(max_length=MAX_TRANSFORM_CHARS,
                                     json_schema_extra={"pattern": TRANSFORM_PATTERN})]

def transform_text(value: str | None) -> str | None:
    """A transform's text checked by the rules the schema states (``TRANSFORM_PATTERN``); ValueError why."""
    if value is None:
        return None
    if not re.match(_TRANSFORM_START, value):
        msg = "transform must be a Spark SQL SELECT (or WITH ... SELECT) query"
        raise ValueError(msg)
    if "{source}" not in value:
        msg = "transform must read the Kafka rows as {source}, e.g. SELECT key, value FROM {source}"
        raise ValueError(msg)
    return value


#: The bootstrap value that makes the daemon start its own in-memory broker (laptop and demo default).
EMBEDDED = "embedded"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _unicode_text(cls, value: object) -> object:
        r"""Refuse text that is not Unicode, and paths holding a NUL byte.

        Lone surrogates (a JSON ``\ud800`` escape; environment bytes that are not UTF-8) cannot be written
        as UTF-8 again: accepted, they failed later, in the mutation log or a response.
        """
        if _lone_surrogate(value):
            msg = "text is not valid Unicode (a lone surrogate such as \\ud800)"
            raise ValueError(msg)
        if isinstance(value, PurePath) and "\x00" in str(value):
            msg = "a path cannot hold a NUL byte"
            raise ValueError(msg)
        return value


def _lone_surrogate(value: object) -> bool:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_lone_surrogate(v) for v in value)
    return False


_OFF = {"off", "none", "null", "false", "disabled", ""}


def _off_or(value: object, true_is: str) -> object:
    """``false`` or an "off" word as None (the setting off); ``true`` refused with ``true_is``; else as is."""
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    if isinstance(value, bool):
        raise ValueError(true_is)
    return value
