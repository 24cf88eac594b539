"""The one shape of every error the API returns, and which errors each kind of operation declares.

The declarations make the OpenAPI schema whole: clients and the schema fuzzer check every response
against it. The 401 of a token-guarded operation is declared where the guard is applied
(:func:`~source_backfill.api.app.create_app`): without a token the schema names no 401.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

from source_backfill.api.models import ErrorBody, ErrorDetail

#: An OpenAPI ``responses`` table: status code -> its declaration.
Responses = dict[int | str, dict[str, Any]]

#: What an operation on jobs answers besides its success. 503: the mutation log is unwritable.
ERROR_RESPONSES: Responses = {code: {"model": ErrorBody} for code in (404, 409, 422, 503)}
#: Operations that read a body also answer 400 (not UTF-8, so not JSON at all) and 413 (over the limit).
BODY_ERRORS: Responses = {code: {"model": ErrorBody} for code in (400, 413)}
#: What ControlPlaneGuard answers: 421 to a Host the daemon does not serve (every operation but the probes
#: /live and /ready); on mutations 403 from another origin or site, 415 to a body that is not JSON.
HOST_ERRORS: Responses = {421: {"model": ErrorBody}}
MUTATION_GUARD_ERRORS: Responses = {code: {"model": ErrorBody} for code in (403, 415)}
#: A mutation's errors (a body-less one; add BODY_ERRORS for one that reads a body).
MUTATION_ERRORS: Responses = ERROR_RESPONSES | HOST_ERRORS | MUTATION_GUARD_ERRORS


def error_responses(*codes: int) -> Responses:
    """``ErrorBody`` declared for each of ``codes``."""
    return {code: {"model": ErrorBody} for code in codes}


def error_response(
    status_code: int, type_: str, message: str, field: str | None = None, *,
    details: list[dict[str, Any]] | None = None, headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one shape of every error the API returns."""
    body = ErrorBody(error=ErrorDetail(type=type_, message=message, field=field, details=details))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=status_code,
                        headers=headers)
