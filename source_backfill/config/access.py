"""Who may use the control API: principals from a token file, OIDC bearer tokens (issue 50, tenants).

The single ``api.token`` (or ``api.token_file``) of earlier releases keeps working: it is an admin of every
namespace. ``api.principals_file`` and ``api.oidc`` add principals with roles per namespace; with either
set the daemon serves tenants: every read needs a credential too, a principal sees only the jobs of the
namespaces it holds a role in, and the probes name no job.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from source_backfill.config.base import Name, _Frozen

#: The namespace of a job that names none (and of every job created before namespaces).
DEFAULT_NAMESPACE = "default"

#: The algorithms a token may be signed with: asymmetric ones, whose verifying key cannot sign.
ASYMMETRIC_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES384", "ES512", "EdDSA"})
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class OidcConfig(_Frozen):
    """An OIDC issuer whose signed bearer tokens (JWT) the API accepts, verified against its JWKS."""

    issuer: str = Field(min_length=1, description="The tokens' `iss`, exactly as the issuer writes it.")
    audience: str = Field(min_length=1, description=(
        "The `aud` a token must name (this daemon's client id at the issuer)."))
    jwks_url: str = Field(description=(
        "Where the issuer serves its signing keys (JWKS): https (plain http to a loopback host only); "
        "cached `jwks_ttl_s`, fetched again for a key id not held (at most once per 30 s)."))
    algorithms: list[str] = Field(default_factory=lambda: ["RS256"], description=(
        "Signature algorithms accepted, asymmetric only (RS*, PS*, ES*, EdDSA): `none` and HS* are refused "
        "at start, and a token whose header names another algorithm is refused before any key lookup."))
    roles_claim: str = Field(default="source_backfill_roles", min_length=1, description=(
        "The claim holding the principal's roles, `{namespace: role}` (`\"*\"` for every namespace; roles "
        "`viewer`, `operator`, `editor`, `admin`). A token without it holds no role: every route says 403."))
    name_claim: str = Field(default="sub", min_length=1, description=(
        "The claim that names the principal (in the log)."))
    leeway_s: float = Field(default=30.0, ge=0, le=300, description=(
        "Clock skew allowed on `exp` and `nbf`."))
    jwks_ttl_s: float = Field(default=300.0, gt=0, le=86_400, description="How long fetched keys are kept.")
    ca_file: Path | None = Field(default=None, description=(
        "A CA bundle (PEM) to verify the JWKS server's certificate with (a private CA); default: the "
        "system's."))

    @field_validator("jwks_url")
    @classmethod
    def _keys_over_tls(cls, value: str) -> str:
        # whoever can change the keys in transit can mint any token
        url = urlsplit(value)
        if not url.hostname or url.scheme not in ("http", "https") or (
                url.scheme == "http" and url.hostname not in _LOOPBACK):
            msg = f"oidc.jwks_url {value!r} must be an https URL (http only to a loopback host)"
            raise ValueError(msg)
        return value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str]) -> list[str]:
        if not value:
            msg = "oidc.algorithms must name at least one algorithm"
            raise ValueError(msg)
        for alg in value:
            if alg.lower() == "none" or alg.upper().startswith("HS"):
                msg = (f"oidc.algorithms: {alg!r} is refused: a token must be signed with the issuer's "
                       "private key (none signs nothing; HS* would accept its public key as a secret)")
                raise ValueError(msg)
            if alg not in ASYMMETRIC_ALGORITHMS:
                msg = f"oidc.algorithms: unknown {alg!r} (one of {', '.join(sorted(ASYMMETRIC_ALGORITHMS))})"
                raise ValueError(msg)
        return value


class NamespaceConfig(_Frozen):
    """What one tenant's jobs may use: which sources they read, where their tables go, how many there are.

    A namespace not declared (and ``default`` unless declared) binds nothing: any source, anywhere under
    ``daemon.data_root``, any number of jobs.
    """

    name: Name = Field(description="The namespace (`jobs[].namespace`; its jobs are named `<name>.<job>`).")
    sources: list[Name] | None = Field(default=None, description=(
        "The sources its jobs may read; a create naming another is told the source does not exist (the "
        "daemon's other sources are not listed). Unset: every source."))
    max_jobs: int | None = Field(default=None, ge=0, description=(
        "Live jobs at most (dropped ones not counted); a create past it is refused with 403 "
        "`quota_exceeded`, also when creates race (counted under the registry's lock). Unset: no limit."))

    max_rate_limit: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=(
        "The highest history rate limit (rows/s) a job of it may have: a create or `PATCH` asking more, or "
        "unlimited, is refused with 403 `quota_exceeded` (so a job must name its `rate_limit`). Unset: no "
        "ceiling."))

    max_bytes_per_day: int | None = Field(default=None, gt=0, description=(
        "Bytes its jobs may add to their tables per UTC day (the Delta files' sizes, counted by table "
        "version, saved under the state root: a crash neither loses nor doubles a count). Once written: "
        "its creates are refused with 403 `quota_exceeded` and its jobs' history copies are held (as "
        "paused; `history_held` in the job's view) until the next day; their live rows are still "
        "committed. Metrics `namespace_table_bytes_written_total`, `namespace_history_held`. Unset: no "
        "limit."))

    width_share: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False, description=(
        "Its share of each source's history width against the other namespaces' (1 each by default): "
        "the copies' turns go first to the namespace that held the fewest slot-seconds for its share, "
        "then to its first job waiting, so two namespaces of share 1 each hold about half the width over "
        "time whatever their numbers of jobs (docs/guides/history-width.md)."))

    @property
    def folder(self) -> str:
        """The folder of ``daemon.data_root`` its jobs' tables must lie in (when a data root is set)."""
        return self.name


__all__ = ["ASYMMETRIC_ALGORITHMS", "DEFAULT_NAMESPACE", "NamespaceConfig", "OidcConfig"]
