"""Where a job's history starts (``jobs[].start``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from source_backfill.config.base import _Frozen
from source_backfill.core.splits import parse_split_id
from source_backfill.errors import StateFormatError

if TYPE_CHECKING:
    pass


# -- job start positions ------------------------------------------------------------------------------
def _kind_required(schema: dict[str, Any]) -> None:
    schema["required"] = ["kind", *(r for r in schema.get("required", []) if r != "kind")]


class _Start(_Frozen):
    #: ``kind`` picks the start position, so a request must name it (the default only serves Python callers);
    #: the schema says so, or a client could send ``{"timestamp_ms": 0}``, valid by the schema, and get 422.
    model_config = ConfigDict(json_schema_extra=_kind_required)


class EarliestStart(_Start):
    """Backfill from the earliest offset still in the log (the default)."""

    kind: Literal["earliest"] = Field(default="earliest", description="`earliest`: from the log start.")


class OffsetsStart(_Start):
    """Backfill from an explicit offset per split (``"topic:partition" -> offset``); others from earliest."""

    kind: Literal["offsets"] = Field(default="offsets", description="`offsets`: from an offset per split.")
    #: The schema states the rule _split_ids checks, so API clients (and the schema fuzzer) see it.
    offsets: dict[str, Annotated[int, Field(ge=0)]] = Field(
        json_schema_extra={"propertyNames": {"pattern": r"^[\s\S]+:[0-9]+$"}},
        description='The first offset to backfill per split, `{"topic:partition" = offset}`; the splits it '
                    "does not name start at the earliest offset.",
    )

    @field_validator("offsets")
    @classmethod
    def _split_ids(cls, value: dict[str, int]) -> dict[str, int]:
        for split in value:
            try:
                parse_split_id(split)
            except StateFormatError as exc:  # pydantic reports a ValueError as a validation error
                raise ValueError(str(exc)) from None
        return value


class TimestampStart(_Start):
    """Backfill from the first record at or after ``timestamp_ms`` (Kafka record timestamps)."""

    kind: Literal["timestamp"] = Field(default="timestamp", description="`timestamp`: from a record time.")
    timestamp_ms: Annotated[int, Field(ge=0)] = Field(
        description="Milliseconds since the Unix epoch: each split starts at its first record whose Kafka "
                    "timestamp is at or after it (in the source's archive too, below the log start).")


class LatestStart(_Start):
    """No history: only records after the job's attach position (RisingWave's ``scan.startup.mode = latest``).

    Every split is Finished at attach; the live stream brings what follows.
    """

    kind: Literal["latest"] = Field(default="latest",
                                    description="`latest`: no history, only records after the attach.")


StartSpec = Annotated[
    EarliestStart | OffsetsStart | TimestampStart | LatestStart, Field(discriminator="kind")
]
