"""Refuse requests a browser was tricked into sending.

A foreign ``Host`` (DNS rebinding), a foreign ``Origin`` or ``Sec-Fetch-Site`` on a mutation (cross-site
request forgery), a mutation whose body is not JSON (an HTML form's ``text/plain`` or urlencoded POST,
which a browser sends cross-site without asking).

A token does not make these checks unnecessary: a page the operator opens may hold it (the status page
keeps it in the tab), and without a token nothing else stands between a web page and the jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from source_backfill.api.responses import error_response
from source_backfill.config import LOOPBACK_HOSTS, normalize_host

logger = logging.getLogger(__name__)

#: Methods that change something; only these are checked for Origin, Sec-Fetch-Site and Content-Type.
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The probes answer whatever the Host: Kubernetes names the pod's IP address.
PROBE_PATHS = frozenset({"/live", "/ready"})
#: What a browser says of a request that another site's page (or another port of this host) made.
_FOREIGN_FETCH_SITES = frozenset({b"cross-site", b"same-site"})
_DEFAULT_PORTS = {"http": 80, "https": 443}

HOST_NOT_ALLOWED = 421
FORBIDDEN = 403
UNSUPPORTED_MEDIA_TYPE = 415


class HostAllowList:
    """Host names a request may name: exact names, ``*.domain`` (its subdomains), or ``*`` (any)."""

    def __init__(self, hosts: Iterable[str]) -> None:
        names = {n for n in (normalize_host(h) for h in hosts) if n is not None}
        self.any = "*" in names
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))
        self.names = frozenset(n for n in names if not n.startswith("*"))

    def allows(self, host: str | None) -> bool:
        """Whether the (normalized) host name is served."""
        if host is None:
            return False
        return self.any or host in self.names or any(host.endswith(s) for s in self.suffixes)


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header -> (normalized name, port or None); None when it is not ``name[:port]``."""
    value = value.strip()
    if not value or any(c in value for c in "/\\@?#*, \t"):
        return None
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
    elif ":" in value:
        return None  # an IPv6 address must be in brackets
    else:
        name, port_text = value, None
    if port_text is not None and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        return None
    normalized = normalize_host(name)
    if normalized is None or normalized.startswith("*"):
        return None
    return normalized, int(port_text) if port_text is not None else None


def same_origin(origin: str, host: tuple[str, int | None]) -> bool:
    """Whether ``Origin`` names the host the request was sent to.

    The scheme is not compared (a proxy may terminate TLS); the port is, the scheme's default standing
    for none.
    """
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path or parts.username:
        return False
    name = normalize_host(parts.hostname)
    if name != host[0]:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    return (port or default) == host[1] if host[1] is not None else port in (None, default)


class ControlPlaneGuard:
    """ASGI middleware refusing what a browser was tricked into sending, before anything else sees it.

    A request to a Host not served: 421; a mutation from another origin or site: 403; a mutation whose
    body is not JSON: 415.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = LOOPBACK_HOSTS) -> None:
        self.app = app
        self.hosts = HostAllowList(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass what is allowed through; answer the rest with an error body."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        code, type_, message = refusal
        client = scope.get("client") or ("?", 0)
        logger.info('request refused reason="%s" method="%s" path=%r client="%s"',
                    type_, scope["method"], scope["path"], client[0])
        response = error_response(code, type_, message,
                                  headers={"Connection": "close"} if code == HOST_NOT_ALLOWED else None)
        await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in headers and name in (b"host", b"origin", b"content-type"):
                headers[name] = b""  # two of them: which one would a proxy have looked at? neither
            else:
                headers.setdefault(name, value)
        raw_host = headers.get(b"host")
        host = split_host(raw_host.decode("latin-1")) if raw_host is not None else None
        if scope["path"] not in PROBE_PATHS and (host is None or not self.hosts.allows(host[0])):
            return (HOST_NOT_ALLOWED, "host_not_allowed",
                    "this daemon does not serve the host the request names (api.allowed_hosts)")
        if scope["method"] not in MUTATING_METHODS:
            return None
        if headers.get(b"sec-fetch-site", b"").strip().lower() in _FOREIGN_FETCH_SITES:
            return FORBIDDEN, "cross_origin", "a mutation from another site's page is refused"
        origin = headers.get(b"origin")
        if origin is not None and (host is None or not same_origin(origin.decode("latin-1"), host)):
            return FORBIDDEN, "cross_origin", "a mutation from another origin is refused"
        content_type = headers.get(b"content-type")
        has_body = headers.get(b"content-length", b"0").strip() not in (b"0", b"") or (
            b"transfer-encoding" in headers)
        if content_type is not None or has_body:
            media = (content_type or b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                return (UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                        "a request body must be JSON (Content-Type: application/json)")
        return None
