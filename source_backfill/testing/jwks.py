"""A stand-in OIDC issuer for tests: signs tokens and serves its keys over real HTTP.

:class:`JwksServer` listens on loopback (a free port) and serves what a verifier fetches from an issuer,
``/.well-known/openid-configuration`` and ``/.well-known/jwks.json``, counting the requests so a test
can tell how often the keys were fetched. :meth:`JwksServer.token` signs a token with the current key
(or one named by ``kid``, or a key the server does not publish), :meth:`JwksServer.rotate` makes a new
key current::

    with JwksServer() as issuer:
        settings = OidcConfig(issuer=issuer.issuer, audience=issuer.audience, jwks_url=issuer.jwks_url)
        token = issuer.token(sub="alice", roles={"team-a": "editor"})
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

JWKS_PATH = "/.well-known/jwks.json"
DISCOVERY_PATH = "/.well-known/openid-configuration"
#: The RSA algorithms :meth:`JwksServer.token` signs with (the server's keys are RSA keys).
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")


def new_rsa_key() -> rsa.RSAPrivateKey:
    """A fresh 2048-bit RSA private key."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class JwksServer:
    """An issuer on ``http://127.0.0.1:<free port>``: its keys by ``kid``, the latest one current.

    A context manager (or :meth:`start` and :meth:`close`); the server runs in a daemon thread.
    """

    def __init__(self, audience: str = "source-backfill", roles_claim: str = "source_backfill_roles") -> None:
        self.audience = audience
        self.roles_claim = roles_claim
        #: Requests served, by path.
        self.hits: Counter[str] = Counter()
        self._keys: dict[str, rsa.RSAPrivateKey] = {}
        self._published: list[str] = []
        self._serial = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self.rotate()

    @property
    def url(self) -> str:
        """The server's base URL; also the issuer (``iss``) of its tokens."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def issuer(self) -> str:
        """What its tokens hold in ``iss``."""
        return self.url

    @property
    def jwks_url(self) -> str:
        """Where its public keys are served."""
        return self.url + JWKS_PATH

    @property
    def kid(self) -> str:
        """The current key's id: the one :meth:`token` signs with unless told otherwise."""
        with self._lock:
            return self._published[-1]

    def jwks_fetches(self) -> int:
        """How many times the keys were fetched."""
        with self._lock:
            return self.hits[JWKS_PATH]

    def rotate(self, keep_old: bool = True) -> str:
        """Make a new key (a new ``kid``) current; the old ones stay published unless not ``keep_old``."""
        key = new_rsa_key()
        with self._lock:
            self._serial += 1
            kid = f"key-{self._serial}"
            self._keys[kid] = key
            self._published = [*self._published, kid] if keep_old else [kid]
        return kid

    def jwks(self) -> dict[str, Any]:
        """The JWKS document served: the published keys' public halves."""
        with self._lock:
            keys = [(kid, self._keys[kid]) for kid in self._published]
        entries = []
        for kid, key in keys:
            jwk: dict[str, Any] = dict(RSAAlgorithm.to_jwk(key.public_key(), as_dict=True))
            entries.append({**jwk, "kid": kid, "use": "sig"})
        return {"keys": entries}

    def public_pem(self, kid: str | None = None) -> bytes:
        """The PEM of a key's public half (the current key's by default): what a forger would HMAC with."""
        kid = kid or self.kid
        with self._lock:
            key = self._keys[kid]
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)

    def token(self, sub: str = "alice", roles: Mapping[str, str] | None = None, aud: str | None = None,
              exp_in_s: float = 300, nbf_in_s: float | None = None, iss: str | None = None,
              kid: str | None = None, alg: str = "RS256", extra: Mapping[str, Any] | None = None,
              key: rsa.RSAPrivateKey | None = None) -> str:
        """A signed token: ``roles`` None leaves the roles claim out, ``exp_in_s`` negative has it expired.

        ``extra`` adds claims or replaces them; a claim it gives as None is left out (``{"exp": None}``).

        ``kid`` names the key to sign with (an id the server never had: the current key signs, under that
        id); ``key`` signs with a key of the caller's instead, under ``kid`` or the current id.
        """
        now = time.time()
        claims: dict[str, Any] = {"sub": sub, "iss": iss or self.issuer, "aud": aud or self.audience,
                                  "iat": int(now), "exp": int(now + exp_in_s)}
        if nbf_in_s is not None:
            claims["nbf"] = int(now + nbf_in_s)
        if roles is not None:
            claims[self.roles_claim] = dict(roles)
        for name, value in (extra or {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return self.sign(claims, kid=kid, alg=alg, key=key)

    def sign(self, claims: Mapping[str, Any], kid: str | None = None, alg: str = "RS256",
             key: rsa.RSAPrivateKey | None = None) -> str:
        """``claims`` signed as they are (none added): ``kid`` and ``key`` as in :meth:`token`."""
        if alg not in RSA_ALGORITHMS:
            msg = f"the server signs with RSA keys: alg must be one of {', '.join(RSA_ALGORITHMS)}"
            raise ValueError(msg)
        kid = kid or self.kid
        with self._lock:
            signer = key or self._keys.get(kid) or self._keys[self._published[-1]]
        return jwt.encode(dict(claims), signer, algorithm=alg, headers={"kid": kid})

    def start(self) -> JwksServer:
        """Serve in a daemon thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                            name="jwks-server", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> JwksServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server._lock:
                    server.hits[self.path] += 1
                if self.path == JWKS_PATH:
                    body = server.jwks()
                elif self.path == DISCOVERY_PATH:
                    body = {"issuer": server.issuer, "jwks_uri": server.jwks_url,
                            "id_token_signing_alg_values_supported": list(RSA_ALGORITHMS)}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the counts are in ``hits``."""

        return Handler
