"""OIDC bearer tokens checked against a real issuer's keys served over HTTP (JwksServer on loopback)."""

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from source_backfill.api.oidc import UNKNOWN_KID_REFETCH_S, OidcVerifier
from source_backfill.config import OidcConfig
from source_backfill.core.access import Role
from source_backfill.errors import AuthenticationError, ConfigError
from source_backfill.testing.jwks import JwksServer, new_rsa_key


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def issuer():
    with JwksServer() as server:
        yield server


@pytest.fixture
def fresh_issuer():
    with JwksServer() as server:
        yield server


def _settings(server, **kwargs):
    return OidcConfig(issuer=server.issuer, audience=server.audience, jwks_url=server.jwks_url, **kwargs)


def _verifier(server, clock=None, **kwargs):
    return OidcVerifier(_settings(server, **kwargs), clock=clock or Clock())


def _refused(verifier, token):
    with pytest.raises(AuthenticationError) as raised:
        verifier.authenticate(token)
    message = str(raised.value)
    for part in token.split("."):
        assert len(part) < 8 or part not in message
    return message


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(server, **extra):
    now = int(time.time())
    return {"sub": "mallory", "iss": server.issuer, "aud": server.audience, "iat": now, "exp": now + 300,
            "source_backfill_roles": {"*": "admin"}, **extra}


def test_a_valid_token_is_its_principal_with_roles(issuer):
    token = issuer.token(sub="alice", roles={"team-a": "editor", "*": "Viewer"})
    principal = _verifier(issuer).authenticate(token)
    assert principal.name == "alice" and principal.source == "oidc"
    assert dict(principal.roles) == {"team-a": Role.EDITOR, "*": Role.VIEWER}
    assert principal.may(Role.EDITOR, "team-a") and not principal.may(Role.OPERATOR, "team-b")


def test_another_claim_can_name_the_principal(issuer):
    token = issuer.token(roles={"team-a": "viewer"}, extra={"email": "alice@example.com"})
    assert _verifier(issuer, name_claim="email").authenticate(token).name == "alice@example.com"
    assert "'email' is missing" in _refused(_verifier(issuer, name_claim="email"), issuer.token())


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"exp_in_s": -120}, "token expired"),
    ({"nbf_in_s": 120}, "token not yet valid"),
    ({"aud": "someone-else"}, "wrong audience"),
    ({"iss": "http://127.0.0.1:1"}, "wrong issuer"),
    ({"extra": {"exp": None}}, "claim 'exp' missing"),
    ({"extra": {"sub": None}}, "claim 'sub' missing"),
])
def test_claims_that_do_not_hold_are_refused(issuer, kwargs, reason):
    assert _refused(_verifier(issuer), issuer.token(roles={"a": "viewer"}, **kwargs)) == reason


def test_the_leeway_forgives_a_little_clock_skew(issuer):
    assert _verifier(issuer).authenticate(issuer.token(exp_in_s=-10, nbf_in_s=10)).name == "alice"
    assert _refused(_verifier(issuer, leeway_s=0), issuer.token(exp_in_s=-10)) == "token expired"


def test_alg_none_is_refused_before_any_key_is_fetched(fresh_issuer):
    header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": fresh_issuer.kid}).encode())
    token = f"{header}.{_b64(json.dumps(_claims(fresh_issuer)).encode())}."
    assert _refused(_verifier(fresh_issuer), token) == "algorithm 'none' is not allowed"
    assert fresh_issuer.jwks_fetches() == 0


def test_hs256_signed_with_the_public_key_is_refused(fresh_issuer):
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": fresh_issuer.kid}).encode())
    signing_input = f"{header}.{_b64(json.dumps(_claims(fresh_issuer)).encode())}"
    mac = hmac.new(fresh_issuer.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{_b64(mac)}"
    assert _refused(_verifier(fresh_issuer), token) == "algorithm 'HS256' is not allowed"
    assert fresh_issuer.jwks_fetches() == 0


def test_an_allowed_alg_on_a_key_of_another_type_is_refused(issuer):
    stranger = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(_claims(issuer), stranger, algorithm="ES256", headers={"kid": issuer.kid})
    verifier = _verifier(issuer, algorithms=("RS256", "ES256"))
    assert _refused(verifier, token) == "the key of that kid is not for ES256"
    assert _refused(_verifier(issuer), token) == "algorithm 'ES256' is not allowed"


def test_a_token_signed_by_a_key_the_issuer_does_not_publish_is_refused(issuer):
    token = issuer.token(roles={"*": "admin"}, key=new_rsa_key())
    assert _refused(_verifier(issuer), token) == "bad signature"


def test_garbage_is_not_a_jwt(issuer):
    assert _refused(_verifier(issuer), "not.a.jwt-at-all") == "not a JWT"
    assert _refused(_verifier(issuer), "") == "empty token"


def test_unknown_kids_refetch_the_keys_at_most_every_30_s(fresh_issuer):
    clock = Clock()
    verifier = _verifier(fresh_issuer, clock)
    verifier.authenticate(fresh_issuer.token())
    assert fresh_issuer.jwks_fetches() == 1
    for i in range(20):
        clock.now += 1
        assert _refused(verifier, fresh_issuer.token(kid=f"made-up-{i}")) == "unknown key id"
    assert fresh_issuer.jwks_fetches() == 2
    clock.now += UNKNOWN_KID_REFETCH_S
    _refused(verifier, fresh_issuer.token(kid="made-up-again"))
    assert fresh_issuer.jwks_fetches() == 3
    verifier.authenticate(fresh_issuer.token())  # a known kid fetches nothing
    assert fresh_issuer.jwks_fetches() == 3


def test_a_rotated_key_is_picked_up_and_a_dropped_one_refused_after_the_ttl(fresh_issuer):
    clock = Clock()
    verifier = _verifier(fresh_issuer, clock)
    old = fresh_issuer.token(roles={"a": "viewer"})
    verifier.authenticate(old)
    new_kid = fresh_issuer.rotate()
    assert verifier.authenticate(fresh_issuer.token(roles={"a": "viewer"})).name == "alice"
    assert fresh_issuer.jwks_fetches() == 2
    verifier.authenticate(old)  # still published
    fresh_issuer.rotate(keep_old=False)
    clock.now += 300
    assert _refused(verifier, old) == "unknown key id"
    assert _refused(verifier, fresh_issuer.token(kid=new_kid)) == "unknown key id"
    assert verifier.authenticate(fresh_issuer.token()).name == "alice"


def test_the_keys_held_serve_while_the_issuer_is_down():
    clock = Clock()
    with JwksServer() as server:
        verifier = _verifier(server, clock)
        token = server.token()
        verifier.authenticate(token)
    clock.now += 1000
    assert verifier.authenticate(token).name == "alice"


def test_without_keys_every_token_is_refused():
    with JwksServer() as server:
        token = server.token()
        settings = _settings(server)
    assert _refused(OidcVerifier(settings, clock=Clock()), token) == "the issuer's keys cannot be had"


def test_no_roles_claim_is_a_principal_that_sees_nothing(issuer):
    principal = _verifier(issuer).authenticate(issuer.token(sub="bob", roles=None))
    assert principal.name == "bob" and dict(principal.roles) == {}
    assert not principal.sees("team-a")


@pytest.mark.parametrize(("roles", "reason"), [
    ({"team-a": "superuser"}, "namespace 'team-a': unknown role 'superuser'"),
    ({"team a": "viewer"}, "bad namespace 'team a'"),
    (["team-a"], "must be a mapping"),
])
def test_a_bad_roles_claim_refuses_the_token(issuer, roles, reason):
    token = issuer.token(extra={"source_backfill_roles": roles})
    assert reason in _refused(_verifier(issuer), token)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"algorithms": ("HS256",)}, "'HS256' is refused"),
    ({"algorithms": ("RS256", "none")}, "'none' is refused"),
    ({"algorithms": ("RS1",)}, "unknown 'RS1'"),
    ({"algorithms": ()}, "at least one"),
    ({"jwks_url": "http://idp.example.com/jwks"}, "https URL"),
    ({"jwks_url": "ftp://127.0.0.1/jwks"}, "https URL"),
    ({"issuer": ""}, "at least 1 character"),
    ({"jwks_ttl_s": 0}, "jwks_ttl_s"),
])
def test_settings_refuse_what_would_open_the_door(kwargs, message):
    base = {"issuer": "https://idp.example.com", "audience": "source-backfill",
            "jwks_url": "https://idp.example.com/jwks"}
    with pytest.raises(ValueError, match=message):
        OidcConfig(**{**base, **kwargs})


def test_settings_take_a_list_of_algorithms():
    settings = OidcConfig(issuer="https://idp", audience="aud", jwks_url="https://idp/jwks",
                          algorithms=["ES256", "EdDSA"])
    assert settings.algorithms == ["ES256", "EdDSA"]


def test_the_issuer_serves_discovery(issuer):
    import httpx

    document = httpx.get(issuer.url + "/.well-known/openid-configuration").json()
    assert document["jwks_uri"] == issuer.jwks_url and document["issuer"] == issuer.issuer


def test_a_ca_file_that_cannot_be_read_is_a_config_error(tmp_path):
    settings = OidcConfig(issuer="https://idp", audience="aud", jwks_url="https://idp/jwks",
                          ca_file=tmp_path / "absent.pem")
    with pytest.raises(ConfigError, match="oidc.ca_file"):
        OidcVerifier(settings)
