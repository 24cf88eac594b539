"""The topic ids a source first read its topics under, kept beside its checkpoint (``core/topic_ids.py``).

``<state_root>/sources/<source>/topic_ids.json``: ``{topic: id}``, written whole (a temporary file,
fsynced, renamed over it) whenever a topic is seen for the first time. :func:`recreated_topics` reads the
cluster's ids, compares, records the new ones and returns the topics created again since. A cluster that
does not answer is no verdict (an empty list): the live query's own errors say why it cannot read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from source_backfill.core.topic_ids import Recreated, compare
from source_backfill.errors import StateFormatError, one_line

if TYPE_CHECKING:
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig

logger = logging.getLogger(__name__)

FILE_NAME = "topic_ids.json"


def read_record(path: Path) -> dict[str, str]:
    """The recorded ids (empty when none were recorded: a source of an older release, or a new one)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        msg = f"{path.name} of a source cannot be read ({one_line(exc)}): remove it to record the ids again"
        raise StateFormatError(msg) from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        msg = f"{path.name} of a source holds something other than topic ids: remove it to record them again"
        raise StateFormatError(msg)
    return data


def write_record(path: Path, ids: Mapping[str, object]) -> None:
    """Write ``ids`` (any JSON object: the anchors too) whole: a temporary file, fsynced, renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(ids, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def recreated_topics(admin: KafkaAdmin, config: SourceConfig, folder: Path,
                     found_ids: dict[str, str] | None = None) -> list[Recreated]:
    """The source's topics created again since it first read them (see the module); records new ones.

    ``found_ids``: filled with the ids the cluster gave now (empty when it gave no answer).
    """
    path = folder / FILE_NAME
    try:
        found = admin.topic_ids(config.topics, config.topic_pattern)
    except Exception as exc:  # noqa: BLE001 - no answer is no verdict
        logger.warning('topic ids not read source="%s" error="%s"', config.name, one_line(exc))
        return []
    if found_ids is not None:
        found_ids.update(found)
    recorded = read_record(path)
    recreated, keep = compare(recorded, found)
    if keep != recorded:
        write_record(path, keep)
        logger.info('topic ids recorded source="%s" topics=%s', config.name,
                    ",".join(sorted(keep.keys() - recorded.keys())))
    return recreated
