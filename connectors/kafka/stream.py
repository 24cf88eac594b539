"""Offsets of a streaming query's micro-batches, read back from Spark's checkpoint offset log.

Spark writes ``<checkpoint>/offsets/<batch_id>`` before running batch ``batch_id``: a line ``v1``, a line of
batch metadata JSON, then one line per source with that source's end offset (``-`` when a source has none).
For the ``kafka_py`` source that offset is ``{"splits": {"topic:partition": next_offset}, "tick": n}``.
The start of batch N is the end of batch N-1.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from source_backfill.errors import KafkaConnectorError

logger = logging.getLogger(__name__)


def _source_offsets(path: Path, source_index: int) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        msg = f"Spark offset log entry {path} does not exist (batch not planned yet, or purged)"
        raise KafkaConnectorError(msg) from None
    if not lines or lines[0].strip() != "v1" or len(lines) < 3:
        msg = f"unexpected Spark offset log format in {path}"
        raise KafkaConnectorError(msg)
    sources = lines[2:]
    if source_index >= len(sources):
        msg = f"offset log {path} has {len(sources)} source(s); no source #{source_index}"
        raise KafkaConnectorError(msg)
    raw = sources[source_index].strip()
    if raw in ("", "-"):
        return {}
    try:
        parsed: Any = json.loads(raw)
        if isinstance(parsed, str):  # some sources serialise their offset as a JSON string
            parsed = json.loads(parsed)
        return {str(k): int(v) for k, v in dict(parsed["splits"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"source #{source_index} in {path} is not a kafka_py offset: {raw[:200]!r}"
        raise KafkaConnectorError(msg) from exc


def batch_offsets(
    checkpoint_dir: str, batch_id: int, source_index: int = 0
) -> tuple[dict[str, int] | None, dict[str, int]]:
    """Exclusive start and end positions per split of micro-batch ``batch_id``.

    Start is ``None`` for batch 0. Splits present at the end but absent from the start (new partitions)
    are absent from the start too: they begin at their earliest offset. ``source_index`` picks the source
    when the query reads several.
    """
    log = Path(checkpoint_dir) / "offsets"
    end = _source_offsets(log / str(batch_id), source_index)
    if batch_id <= 0:
        return None, end
    start = _source_offsets(log / str(batch_id - 1), source_index)
    return start, end
