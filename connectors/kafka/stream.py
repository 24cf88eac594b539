"""Offsets of a streaming query's micro-batches, read back from Spark's checkpoint offset log.

Spark writes ``<checkpoint>/offsets/<batch_id>`` before running batch ``batch_id``: a line ``v1``, a line of
batch metadata JSON, then one line per source with that source's end offset (``-`` when a source has none).
For the ``kafka_py`` source that offset is ``{"splits": {"topic:partition": next_offset}, "tick": n}``
(+ ``"born": {split: first_offset}`` for splits first read in that batch); for Spark's Kafka source it is
``{"topic": {"partition": next_offset}}``. The start of batch N is the end of batch N-1, plus the ``born``
offsets of batch N (Spark's source records none: a split first read in batch N is missing from its
start, and the runtime takes its log start, where Spark's source starts a new partition). Spark writes
the entry before the batch runs (it is the write-ahead log of the query), so the positions are known
inside ``foreachBatch`` and on a replay.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from connectors.kafka.spark_kafka import split_offsets
from source_backfill.errors import KafkaConnectorError

logger = logging.getLogger(__name__)


def _source_offsets(path: Path, source_index: int, key: str = "splits") -> dict[str, int]:
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
        if "splits" not in parsed:  # Spark's Kafka source: {"topic": {"0": 23}}, no "born"
            return split_offsets(parsed) if key == "splits" else {}
        if key != "splits" and key not in parsed:
            return {}
        return {str(k): int(v) for k, v in dict(parsed[key]).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"source #{source_index} in {path} is not a Kafka offset: {raw[:200]!r}"
        raise KafkaConnectorError(msg) from exc


def batch_offsets(
    checkpoint_dir: str, batch_id: int, source_index: int = 0
) -> tuple[dict[str, int] | None, dict[str, int]]:
    """Start and end positions per split of micro-batch ``batch_id``: the batch read ``[start, end)``.

    ``start`` is ``None`` for batch 0 (it began at ``startingOffsets``). Otherwise it holds every split of
    ``end``: a split first read in this batch (new partition, new topic of a pattern) starts at the offset
    it was born at (its earliest offset when discovered). ``source_index`` picks the source when the query
    reads several.
    """
    log = Path(checkpoint_dir) / "offsets"
    end = _source_offsets(log / str(batch_id), source_index)
    if batch_id <= 0:
        return None, end
    start = _source_offsets(log / str(batch_id - 1), source_index)
    for sid, first in _source_offsets(log / str(batch_id), source_index, "born").items():
        start.setdefault(sid, first)
    return start, end


#: The tick of the Spark connector's live stream (source #1 of its offset log): one row per micro-batch.
TICK_FORMAT = "rate-micro-batch"
#: The tick of logs written before it: Spark's ``rate`` source, whose offset (seconds since it started, a
#: bare number) moves once a second, so a trigger under a second was not an epoch on a quiet topic.
OLD_TICK_FORMAT = "rate"


def tick_format(checkpoint_dir: str | Path | None) -> str:
    """The tick source a query with this checkpoint must read: the one its offset log was written with.

    A query's sources can not change under its checkpoint (Spark reads each logged offset back with the
    source at that position): a log whose tick offset is a bare number was written by ``rate`` and keeps
    it; a new checkpoint, or one written by ``rate-micro-batch`` (a JSON object), gets
    :data:`TICK_FORMAT`.
    """
    if checkpoint_dir is None or not (log := Path(checkpoint_dir) / "offsets").is_dir():
        return TICK_FORMAT
    batches = [int(p.name) for p in log.iterdir() if p.name.isdigit()]
    if batches:
        lines = (log / str(max(batches))).read_text().splitlines()  # v1, metadata, then a line per source
        if len(lines) >= 4 and lines[3].strip().isdigit():
            return OLD_TICK_FORMAT
    return TICK_FORMAT

