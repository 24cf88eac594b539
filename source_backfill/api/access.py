"""Who is asking, and may they: a request's bearer credential to a principal, and each route's rule.

:class:`Authenticator` takes a credential to a :class:`~source_backfill.core.access.Principal`: the one
``api.token`` (an admin of every namespace, as before namespaces), a static token of
``api.principals_file``, or an OIDC token of ``api.oidc``. :data:`RULES` names, per route, the role it
needs and where the namespace comes from; :func:`authorize` (a FastAPI dependency on every guarded route)
applies it. A route without a rule is refused (fail closed), and the route x role x namespace test fails.

A principal never learns that a job of a namespace it holds no role in exists: such a job answers 404 with
the words of a job that does not exist. In its own namespaces a role too low answers 403.
"""

from __future__ import annotations

import hmac
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import Depends, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from source_backfill.api.context import Context
from source_backfill.api.oidc import OidcVerifier
from source_backfill.api.principals import TokenPrincipals
from source_backfill.config import ApiConfig
from source_backfill.core.access import ADMIN_PRINCIPAL, ALL_NAMESPACES, Principal, Role
from source_backfill.errors import AuthenticationError, JobNotFoundError
from source_backfill.runtime.mutation_log import Actor

logger = logging.getLogger(__name__)

#: Whoever asks a daemon that has no credential configured (a laptop's): everything, as before tokens.
ANONYMOUS = Principal("anonymous", {ALL_NAMESPACES: Role.ADMIN}, "none")

#: Where a route's namespace comes from: the job its path names (``job``); the request's body, checked
#: by the route (``body``); any namespace the principal holds the role in, the route showing only those
#: (``any``); every namespace (``all``: a role held on ``*``).
Scope = Literal["job", "body", "any", "all"]


@dataclass(frozen=True)
class Rule:
    """The role a route needs, and in which namespace."""

    role: Role
    scope: Scope


#: Every guarded route's rule, by (method, path template). PATCH needs EDITOR when it changes the transform
#: (the route checks it); OPERATOR for the rate limit alone. A retry into a new table needs EDITOR (it
#: chooses a table, as a create does; the route checks it); OPERATOR for a plain retry.
RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/jobs"): Rule(Role.VIEWER, "any"),
    ("GET", "/jobs/{name}"): Rule(Role.VIEWER, "job"),
    ("POST", "/jobs"): Rule(Role.EDITOR, "body"),
    ("POST", "/jobs/{name}/pause"): Rule(Role.OPERATOR, "job"),
    ("POST", "/jobs/{name}/resume"): Rule(Role.OPERATOR, "job"),
    ("PATCH", "/jobs/{name}"): Rule(Role.OPERATOR, "job"),
    ("POST", "/jobs/{name}/repair"): Rule(Role.OPERATOR, "job"),
    ("POST", "/jobs/{name}/retry"): Rule(Role.OPERATOR, "job"),  # into a new table: EDITOR (the route)
    ("DELETE", "/jobs/{name}"): Rule(Role.EDITOR, "job"),
    ("POST", "/jobs/{name}/verify"): Rule(Role.VIEWER, "job"),
    ("GET", "/jobs/{name}/verify/{run_id}"): Rule(Role.VIEWER, "job"),
    ("GET", "/metrics"): Rule(Role.VIEWER, "any"),  # a role on "*": every series; else its jobs' (the route)
    ("GET", "/audit"): Rule(Role.VIEWER, "any"),
    ("GET", "/audit/refused"): Rule(Role.VIEWER, "any"),
    ("POST", "/sources/{source}/reset"): Rule(Role.ADMIN, "all"),  # a source is every namespace's
}


class Authenticator:
    """A bearer credential -> its principal, from the token, the principals file and OIDC as configured."""

    def __init__(self, token: bytes | None = None, principals: TokenPrincipals | None = None,
                 oidc: OidcVerifier | None = None) -> None:
        self.token = token
        self.principals = principals
        self.oidc = oidc

    @classmethod
    def from_config(cls, api: ApiConfig) -> Authenticator:
        """The API section's credentials (the principals file read now: ConfigError if it does not load)."""
        token = api.token.get_secret_value().encode() if api.token is not None else None
        principals = TokenPrincipals.from_file(api.principals_file) if api.principals_file else None
        oidc = OidcVerifier(api.oidc) if api.oidc is not None else None
        return cls(token, principals, oidc)

    @property
    def configured(self) -> bool:
        """Whether any credential is configured (else every route is open to :data:`ANONYMOUS`)."""
        return self.token is not None or self.tenants

    @property
    def tenants(self) -> bool:
        """Whether principals with roles per namespace are configured (reads guarded, probes anonymous)."""
        return self.principals is not None or self.oidc is not None

    def authenticate(self, credential: str) -> Principal:
        """The credential's principal; AuthenticationError with a reason that never holds the credential."""
        if not credential:
            msg = "missing bearer token"
            raise AuthenticationError(msg)
        if self.token is not None and hmac.compare_digest(credential.encode(), self.token):
            return ADMIN_PRINCIPAL
        if self.principals is not None and (found := self.principals.authenticate(credential)) is not None:
            return found
        if self.oidc is not None and credential.count(".") == 2:  # a JWT: header.payload.signature
            return self.oidc.authenticate(credential)
        msg = "missing or wrong bearer token"
        raise AuthenticationError(msg)

    def reload(self) -> bool:
        """Read the principals file again (SIGHUP): True when it loaded (else the previous set holds)."""
        return self.principals.reload() if self.principals is not None else True


bearer = HTTPBearer(auto_error=False, description="Needed on mutating calls when the daemon has a token.")


#: An ``X-Request-Id`` a client may give (else one is made): short, and nothing a log line could misread.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id_of(request: Request) -> str:
    """The request's id: its ``X-Request-Id`` when well-formed, else one made for it (kept per request)."""
    found: str | None = getattr(request.state, "request_id", None)
    if found is None:
        given = request.headers.get("x-request-id", "")
        found = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        request.state.request_id = found
    return found


def actor_of(request: Request) -> Actor:
    """Who asks for a mutation (``by=`` of the registry): the principal and the request's id."""
    return Actor(principal_of(request).name, request_id_of(request))


def principal_of(request: Request) -> Principal:
    """Who :func:`authorize` let through; :data:`ANONYMOUS` on a route nothing guards."""
    principal: Principal = getattr(request.state, "principal", ANONYMOUS)
    return principal


def authorize(
    request: Request,
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Let the request through if its principal holds the role its route's :data:`RULES` entry names.

    401 without a credential that authenticates; 404 (a job's own words) for a job of a namespace the
    principal holds no role in; 403 for a role too low where it holds one.
    """
    auth = context.auth
    principal = ANONYMOUS
    if auth.configured:
        try:
            principal = auth.authenticate(credentials.credentials if credentials is not None else "")
        except AuthenticationError as exc:
            refused(request, None, str(exc), status_code=status.HTTP_401_UNAUTHORIZED)
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, str(exc),
                                headers={"WWW-Authenticate": "Bearer"}) from None
    route = request.scope.get("route")
    rule = RULES.get((request.method, getattr(route, "path", "")))
    if rule is None:  # a route added without a rule: closed until it has one
        refused(request, principal, "no access rule for this route", status_code=status.HTTP_403_FORBIDDEN)
        raise HTTPException(status.HTTP_403_FORBIDDEN, "no access rule for this route")
    if rule.scope == "job":
        namespace = context.registry.get(request.path_params["name"]).spec.namespace
        if not principal.sees(namespace):
            refused(request, principal, "job of another namespace", status_code=status.HTTP_404_NOT_FOUND,
                    namespace=namespace)
            msg = f'job "{request.path_params["name"]}" not found'  # the registry's words for no such job
            raise JobNotFoundError(msg)
        require(request, principal, rule.role, namespace)
    elif rule.scope == "all":
        require(request, principal, rule.role, ALL_NAMESPACES)
    elif rule.scope == "any" and not any(principal.may(rule.role, ns) for ns in principal.roles):
        refused(request, principal, f"no {rule.role.name.lower()} role in any namespace",
                status_code=status.HTTP_403_FORBIDDEN)
        raise HTTPException(status.HTTP_403_FORBIDDEN, f'principal "{principal.name}" holds no role')
    request.state.principal = principal
    if request.method not in ("GET", "HEAD"):
        logger.info('request authorized principal="%s" via="%s" method="%s" path=%r request_id="%s"',
                    principal.name, principal.source, request.method, request.url.path,
                    request_id_of(request))
    return principal


def require(request: Request, principal: Principal, role: Role, namespace: str) -> None:
    """403 unless the principal holds ``role`` (or higher) in ``namespace``."""
    if principal.may(role, namespace):
        return
    where = "every namespace" if namespace == ALL_NAMESPACES else f'namespace "{namespace}"'
    about = None if namespace == ALL_NAMESPACES else namespace
    refused(request, principal, f"needs {role.name.lower()} in {where}",
            status_code=status.HTTP_403_FORBIDDEN, namespace=about)
    raise HTTPException(status.HTTP_403_FORBIDDEN,
                        f'principal "{principal.name}" needs the {role.name.lower()} role in {where}')


def refused(request: Request, principal: Principal | None, reason: str, *, status_code: int,
            namespace: str | None = None) -> None:
    """Say a request was refused: a log line, and a row of the refusals' audit table (when kept).

    ``namespace``: the namespace it was about (the job's, the quota's), so that its viewers see the row;
    None: only admins of every namespace do. Never the credential, nor a reason that quotes one.
    """
    client = request.client.host if request.client is not None else "?"
    name = principal.name if principal is not None and principal is not ANONYMOUS else None
    logger.info('request refused principal="%s" reason="%s" method="%s" path=%r client="%s" request_id="%s"',
                name or "-", reason, request.method, request.url.path, client, request_id_of(request))
    api = getattr(request.app.state, "api", None)
    table = getattr(getattr(api, "registry", None), "refusals", None)
    if table is not None:
        table.record({"at": datetime.now(UTC).isoformat(), "by": name, "status": status_code,
                      "reason": reason, "method": request.method, "path": request.url.path,
                      "job": request.path_params.get("name"), "namespace": namespace, "client": client,
                      "request_id": request_id_of(request)})
