"""The routes' context and the token check, called as plain functions (no app, no server)."""

import pytest
from fastapi.security import HTTPAuthorizationCredentials
from starlette.exceptions import HTTPException

from source_backfill.api.context import ApiContext, authorize
from source_backfill.api.routes.ops import status_page


def _context(token: bytes | None = None, verifications=None) -> ApiContext:
    return ApiContext(registry=None, token=token, health=None, verifications=verifications,  # type: ignore[arg-type]
                      dry_run=None, page="", script="")


def _bearer(value: str) -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=value)


def test_without_a_token_anything_passes():
    authorize(_context(), None)
    authorize(_context(), _bearer("whatever"))


def test_the_right_token_passes():
    authorize(_context(b"s3cret"), _bearer("s3cret"))


@pytest.mark.parametrize(("token", "given", "message"), [
    (b"s3cret", None, "missing bearer token"),
    (b"s3cret", "wrong", "missing or wrong bearer token"),
    (b"", None, "missing bearer token"),  # an empty token opens nothing (HTTPBearer gives no empty one)
    (b"", "x", "missing or wrong bearer token"),
])
def test_a_missing_or_wrong_token_is_401_asking_for_bearer(token, given, message):
    with pytest.raises(HTTPException) as raised:
        authorize(_context(token), _bearer(given) if given is not None else None)
    assert raised.value.status_code == 401
    assert raised.value.detail == message
    assert raised.value.headers == {"WWW-Authenticate": "Bearer"}


def test_verify_runs_are_503_on_a_daemon_without_them():
    with pytest.raises(HTTPException) as raised:
        _context().runs()
    assert raised.value.status_code == 503
    runs = object()
    assert _context(verifications=runs).runs() is runs


@pytest.mark.parametrize("required", [True, False])
def test_the_status_page_says_whether_it_needs_a_token(required):
    page, script = status_page(token_required=required)
    assert "{{token_required}}" not in page
    assert f'data-token-required="{"true" if required else "false"}"' in page
    assert script.strip()
