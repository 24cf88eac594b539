"""A topic created again under the same name: told by its id (pure; issue 49).

Kafka gives every topic an id at creation. A topic deleted and created again keeps its name, gets a new
id, and its offsets start at 0 again: a source's checkpoint and its jobs' committed positions then point
into a log that is not the one they were read from. A source records the ids of its topics when it first
reads them and compares them at every start and after every failure of its live query; a different id
stops the source and fails its jobs, naming the topic and both ids, instead of restarting its query
against a log its positions do not belong to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Recreated:
    """A topic whose id is not the one recorded: ``was`` when first read, ``now`` on the cluster."""

    topic: str
    was: str
    now: str

    def __str__(self) -> str:
        return f"topic {self.topic} was deleted and created again (topic id {self.was}, now {self.now})"


def compare(recorded: Mapping[str, str], found: Mapping[str, str]) -> tuple[list[Recreated], dict[str, str]]:
    """The recorded topics whose id changed, and the record to keep (recorded ids, plus new topics').

    A recorded topic that is not found (deleted, not created again yet) keeps its record: its id is
    compared again when it comes back.
    """
    recreated = [Recreated(t, recorded[t], found[t]) for t in sorted(recorded)
                 if t in found and found[t] != recorded[t]]
    keep = {**found, **recorded}
    return recreated, dict(sorted(keep.items()))
