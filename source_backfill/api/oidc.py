"""OIDC bearer tokens: JWTs signed by an issuer, checked against the keys it publishes (its JWKS).

:class:`OidcVerifier` takes a token to a :class:`~source_backfill.core.access.Principal` or refuses it
with :class:`~source_backfill.errors.AuthenticationError`. Before any key is looked up, the header's
``alg`` must be one of ``api.oidc.algorithms`` (:class:`~source_backfill.config.OidcConfig`), which
admits asymmetric algorithms only: a token
``alg: none``, or one re-signed with HMAC using the issuer's public key (which anyone may fetch) as the
secret, is refused by name. The signature is checked with the key the header's ``kid`` names, then
``iss``, ``aud``, ``exp`` and ``nbf`` (``exp``, ``iss``, ``aud`` and ``sub`` must be there).

The roles come from ``api.oidc.roles_claim``, ``{namespace: role}``. A token without that claim
is a principal holding no role: it authenticates (the log can say who asked) and may see nothing. A role
or namespace that does not parse refuses the whole token, rather than granting the part that parsed.

The keys are cached for ``jwks_ttl_s``. A ``kid`` not in the cache (the issuer rotated its keys) fetches
them again, at most once every :data:`UNKNOWN_KID_REFETCH_S` seconds, so a flood of tokens with made-up
``kid`` values costs the issuer one request, not one each. A refresh that fails keeps the keys held.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from source_backfill.config import OidcConfig
from source_backfill.core.access import Principal, parse_roles
from source_backfill.errors import AuthenticationError, ConfigError

logger = logging.getLogger(__name__)

#: A kid the cached keys do not hold fetches them again at most this often.
UNKNOWN_KID_REFETCH_S = 30.0
#: How long fetching the keys may take.
FETCH_TIMEOUT_S = 5.0
SOURCE = "oidc"
#: The JWK key type each algorithm verifies with.
_KEY_TYPES = {**{f"{family}{bits}": "RSA" for family in ("RS", "PS") for bits in (256, 384, 512)},
              **{f"ES{bits}": "EC" for bits in (256, 384, 512)}, "EdDSA": "OKP"}
_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "token expired"), (jwt.ImmatureSignatureError, "token not yet valid"),
    (jwt.InvalidAudienceError, "wrong audience"), (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.InvalidSignatureError, "bad signature"))

#: Fetches a URL's JSON document (the JWKS): the default is httpx; tests and embedders may pass another.
Fetch = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class _Key:
    """A published key: the key object, its JWK ``kty``, and the ``alg`` it is declared for (if any)."""

    key: Any
    kty: str
    alg: str | None


class OidcVerifier:
    """Takes bearer tokens to principals (:meth:`authenticate`); thread-safe, one per daemon.

    ``fetch`` replaces the HTTP fetch of the keys; ``clock`` (monotonic seconds) the cache's clock.
    """

    def __init__(self, settings: OidcConfig, fetch: Fetch | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._fetch = fetch or _http_fetch(str(settings.ca_file) if settings.ca_file is not None else None)
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str | None, _Key] = {}
        self._fresh_until = float("-inf")
        self._refetch_after = float("-inf")

    def authenticate(self, token: str) -> Principal:
        """The token's principal; AuthenticationError with a short reason (never the token) if refused."""
        try:
            header = jwt.get_unverified_header(token) if token else None
        except jwt.PyJWTError:
            header = None
        if header is None:
            msg = "not a JWT" if token else "empty token"
            raise AuthenticationError(msg)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self.settings.algorithms:
            msg = f"algorithm {str(alg)[:16]!r} is not allowed"
            raise AuthenticationError(msg)
        if kid is not None and not isinstance(kid, str):
            msg = "kid is not a string"
            raise AuthenticationError(msg)
        key = self._key(kid)
        if key.kty != _KEY_TYPES[alg] or key.alg not in (None, alg):
            msg = f"the key of that kid is not for {alg}"
            raise AuthenticationError(msg)
        claims = self._decode(token, key.key, alg)
        name = claims.get(self.settings.name_claim)
        if not isinstance(name, str) or not name:
            msg = f"claim {self.settings.name_claim!r} is missing or not a string"
            raise AuthenticationError(msg)
        raw = claims.get(self.settings.roles_claim)
        try:
            roles = parse_roles(raw) if raw is not None else {}
        except ValueError as exc:
            msg = f"{self.settings.roles_claim}: {str(exc)[:200]}"
            raise AuthenticationError(msg) from None
        return Principal(name, roles, SOURCE)

    def _decode(self, token: str, key: Any, alg: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], audience=self.settings.audience,
                issuer=self.settings.issuer, leeway=self.settings.leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"], "enforce_minimum_key_length": True})
        except jwt.PyJWTError as exc:
            reason = next((r for kind, r in _REASONS if isinstance(exc, kind)),
                          f"invalid token ({type(exc).__name__})")
            if isinstance(exc, jwt.MissingRequiredClaimError):
                reason = f"claim {exc.claim!r} missing"
            raise AuthenticationError(reason) from None
        return claims

    def _key(self, kid: str | None) -> _Key:
        with self._lock:
            now = self._clock()
            stale = now >= self._fresh_until
            if stale:
                self._refresh(now)
            key = self._lookup(kid)
            if key is None and not stale and self._keys and now >= self._refetch_after:
                self._refetch_after = now + UNKNOWN_KID_REFETCH_S
                self._refresh(now)
                key = self._lookup(kid)
            held = bool(self._keys)
        if key is not None:
            return key
        msg = ("the issuer's keys cannot be had" if not held
               else "unknown key id" if kid is not None else "no kid, and the issuer has several keys")
        raise AuthenticationError(msg)

    def _lookup(self, kid: str | None) -> _Key | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    def _refresh(self, now: float) -> None:
        try:
            keys = _signing_keys(self._fetch(self.settings.jwks_url))
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self._fresh_until = now + min(UNKNOWN_KID_REFETCH_S, self.settings.jwks_ttl_s)
            logger.warning('oidc keys not fetched, the previous ones stay url="%s" kept=%d reason="%s"',
                           self.settings.jwks_url, len(self._keys), f"{type(exc).__name__}: {exc}"[:300])
            return
        self._keys = keys
        self._fresh_until = now + self.settings.jwks_ttl_s


def _signing_keys(document: Mapping[str, Any]) -> dict[str | None, _Key]:
    """The JWKS document's asymmetric signing keys by kid (symmetric ``oct`` and encryption keys left out)."""
    entries = document.get("keys") if isinstance(document, Mapping) else None
    if not isinstance(entries, list):
        msg = "the JWKS document has no `keys` list"
        raise ValueError(msg)
    keys: dict[str | None, _Key] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kty") == "oct" or entry.get("use", "sig") != "sig":
            continue
        try:
            jwk = jwt.PyJWK(entry)
        except (jwt.PyJWTError, ValueError, KeyError, TypeError):
            continue
        alg = entry.get("alg")
        keys[jwk.key_id] = _Key(jwk.key, str(entry.get("kty")), alg if isinstance(alg, str) else None)
    if not keys:
        msg = "the JWKS document holds no signing key this verifier can use"
        raise ValueError(msg)
    return keys


def _http_fetch(ca_file: str | None) -> Fetch:
    verify: ssl.SSLContext | bool = True
    if ca_file is not None:
        try:
            verify = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            msg = f"oidc.ca_file {ca_file}: cannot be read as CA certificates ({exc})"
            raise ConfigError(msg) from None

    def fetch(url: str) -> Mapping[str, Any]:
        response = httpx.get(url, timeout=FETCH_TIMEOUT_S, verify=verify, follow_redirects=False)
        response.raise_for_status()
        document: Mapping[str, Any] = response.json()
        return document

    return fetch
