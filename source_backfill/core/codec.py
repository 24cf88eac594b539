"""JSON round-trip of a job's split states, refusing malformed input with a clear error."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from source_backfill.core.columnar import SplitTable
from source_backfill.core.splits import SplitId, SplitState, Stage, parse_split_id
from source_backfill.errors import StateFormatError

FORMAT_VERSION = 1


def states_to_json(states: Mapping[SplitId, SplitState]) -> dict[str, Any]:
    """A JSON-able dict of ``states`` (sorted by split)."""
    return {"version": FORMAT_VERSION, "splits": SplitTable.from_states(states).to_json_rows()}


def states_from_json(obj: Any) -> dict[SplitId, SplitState]:
    """Parse what :func:`states_to_json` wrote (a dict or its JSON text); StateFormatError otherwise."""
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError as exc:
            msg = f"backfill state is not valid JSON: {exc}"
            raise StateFormatError(msg) from exc
    if not isinstance(obj, dict):
        msg = f"backfill state must be an object, got {type(obj).__name__}"
        raise StateFormatError(msg)
    if obj.get("version") != FORMAT_VERSION:
        msg = f"backfill state version {obj.get('version')!r} is not supported (expected {FORMAT_VERSION})"
        raise StateFormatError(msg)
    splits = obj.get("splits")
    if not isinstance(splits, dict):
        msg = 'backfill state has no "splits" object'
        raise StateFormatError(msg)
    return {split: _split(split, value) for split, value in splits.items()}


def _split(split: str, value: Any) -> SplitState:
    parse_split_id(split)
    if not isinstance(value, dict):
        msg = f'split "{split}": state must be an object'
        raise StateFormatError(msg)
    missing = {"stage", "offset", "num_consumed_rows", "target_offset"} - value.keys()
    if missing:
        msg = f'split "{split}": missing field(s) {sorted(missing)}'
        raise StateFormatError(msg)
    try:
        stage = Stage(value["stage"])
    except ValueError:
        msg = f'split "{split}": unknown stage {value["stage"]!r}'
        raise StateFormatError(msg) from None
    offset = _int(split, "offset", value["offset"], optional=True, minimum=-1)
    rows = _int(split, "num_consumed_rows", value["num_consumed_rows"], optional=False, minimum=0)
    target = _int(split, "target_offset", value["target_offset"], optional=True, minimum=-1)
    try:
        return SplitState(stage, offset, rows if rows is not None else 0, target)
    except StateFormatError as exc:
        msg = f'split "{split}": {exc}'
        raise StateFormatError(msg) from exc


def _int(split: str, field: str, value: Any, *, optional: bool, minimum: int) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f'split "{split}": field "{field}" must be an integer, got {value!r}'
        raise StateFormatError(msg)
    if value < minimum:
        msg = f'split "{split}": field "{field}" must be >= {minimum}, got {value}'
        raise StateFormatError(msg)
    return value
