"""The routes' context and the credential check, called as plain functions (no app, no server)."""

import pytest
from starlette.exceptions import HTTPException

from source_backfill.api.access import Authenticator
from source_backfill.api.context import ApiContext
from source_backfill.api.routes.ops import status_page
from source_backfill.core.access import ADMIN_PRINCIPAL
from source_backfill.errors import AuthenticationError


def _context(token: bytes | None = None, verifications=None) -> ApiContext:
    return ApiContext(registry=None, auth=Authenticator(token), health=None,  # type: ignore[arg-type]
                      verifications=verifications, dry_run=None, page="", script="")


def test_without_a_token_nothing_is_guarded():
    assert not Authenticator().configured


def test_the_right_token_is_an_admin_of_every_namespace():
    assert Authenticator(b"s3cret").authenticate("s3cret") is ADMIN_PRINCIPAL


@pytest.mark.parametrize(("token", "given", "message"), [
    (b"s3cret", "", "missing bearer token"),
    (b"s3cret", "wrong", "missing or wrong bearer token"),
    (b"", "", "missing bearer token"),  # an empty token opens nothing (HTTPBearer gives no empty one)
    (b"", "x", "missing or wrong bearer token"),
])
def test_a_missing_or_wrong_token_is_refused_saying_so(token, given, message):
    with pytest.raises(AuthenticationError) as raised:
        Authenticator(token).authenticate(given)
    assert str(raised.value) == message


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
