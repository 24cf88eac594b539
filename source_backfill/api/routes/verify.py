"""Verify: a background run per job that checks its table against its source, polled by id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status
from fastapi.responses import Response

from source_backfill.api.context import Context
from source_backfill.api.models import VerifyView
from source_backfill.api.responses import HOST_ERRORS, MUTATION_ERRORS, error_responses
from source_backfill.api.routes.jobs import JobName

#: Guarded when reads are.
reads = APIRouter(tags=["jobs"])
#: Guarded whenever the daemon has a token.
mutations = APIRouter(tags=["jobs"])

RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{1,32}$")]


@mutations.post("/jobs/{name}/verify", status_code=status.HTTP_202_ACCEPTED,
                responses=MUTATION_ERRORS)
def start_verify(name: JobName, response: Response, context: Context) -> VerifyView:
    """Start checking the job's table against its source, exactly once up to its committed positions.

    Answers at once with a run to poll (``GET /jobs/{name}/verify/{id}``); while a run of the job is
    going, that run. Refused (422, saying why) when the table cannot be checked: no table yet, or a
    transform that drops the topic/partition/offset columns. Changes nothing.
    """
    context.registry.get(name)
    run = context.runs().start(name)
    response.headers["Location"] = f"/jobs/{name}/verify/{run.id}"
    return VerifyView(**run.to_json())


@reads.get("/jobs/{name}/verify/{run_id}", responses=HOST_ERRORS | error_responses(404, 422, 503))
def get_verify(name: JobName, run_id: RunId, context: Context) -> VerifyView:
    """A verify run: running, done (ok, summary, per-split counts), refused or error (saying why)."""
    return VerifyView(**context.runs().get(name, run_id).to_json())
