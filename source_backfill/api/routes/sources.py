"""Sources: start over a Kafka source stopped for good (its topic deleted and created again; issue 49).

A source is shared by the jobs of every namespace, so its reset is the daemon's own: it needs the admin
role on every namespace (``*``). What it does, in order, and why it is durable: ``runtime/source_reset.py``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from source_backfill.api.access import actor_of
from source_backfill.api.context import Context
from source_backfill.api.responses import MUTATION_ERRORS
from source_backfill.config import NAME_PATTERN

SourceName = Annotated[str, Path(pattern=NAME_PATTERN, description="The source's name (`sources[].name`).")]

#: Guarded whenever the daemon has a token.
mutations = APIRouter(tags=["sources"])


class SourceResetView(BaseModel):
    """What a source's reset did."""

    source: str
    #: The reset's mutation id (its row in ``GET /audit``).
    id: int
    #: Where the source's old folder (checkpoint, topic ids, anchors) was moved, under the state root.
    moved_to: str
    #: ``running`` once the source started again; ``failed`` when it did not (``error`` says why; reset
    #: it again once the cause is fixed).
    state: str
    error: str | None = None


@mutations.post("/sources/{source}/reset", responses=MUTATION_ERRORS)
def reset_source(source: SourceName, request: Request, context: Context) -> SourceResetView:
    """Start a source stopped for good over: its folder moved aside, the source started again, now.

    Only for a Kafka source stopped because a topic of it was deleted and created again (else 409, the
    source running). Its old folder is kept under the state root (``moved_to``); the source records its
    topics' ids again and reads the new log from a new checkpoint. Its jobs stay failed: run each again
    from the earliest offsets into a new table (``POST /jobs/{name}/retry`` with ``{"from": "earliest",
    "new_table": true}``).
    """
    if context.reset_source is None:
        raise HTTPException(503, "source resets are not available on this daemon")
    done = context.reset_source(source, by=actor_of(request))
    return SourceResetView(source=done.source, id=done.id, moved_to=done.moved_to,
                           state="failed" if done.error else "running", error=done.error)
