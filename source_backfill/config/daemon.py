"""The daemon's own sections: Spark, the control API, metrics, the process."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from source_backfill.config.access import OidcConfig
from source_backfill.config.base import _Frozen, _off_or

if TYPE_CHECKING:
    from source_backfill.metrics import PerSplit


class SparkConfig(_Frozen):
    """Where Spark runs and any extra Spark conf."""

    master: str = Field(default="local[*]", description=(
        "Any Spark master (`local[N]`, `spark://host:7077`, `k8s://...`); the daemon is the application "
        "and its driver (docs: \"Connecting to a cluster\")."))
    conf: dict[str, str] = Field(default_factory=dict, description=(
        "Spark conf over the defaults of `runtime/spark.py`'s `DEFAULT_CONF`: among them "
        "`spark.driver.memory = 2g` (in local mode the one JVM's heap, executors included), "
        "`spark.kafka.consumer.fetchedData.cache.timeout = 10s` (Spark's 5 min kept every history read's "
        "last polls and ran the heap out under load), `spark.kafka.consumer.cache.capacity = 1024` "
        "(Spark's 64 is a soft cap past which every borrow closes idle consumers), `spark.locality.wait = "
        "0s` (the scheduler waited 3 s for the executor Spark's Kafka source prefers per partition). A "
        "daemon with no `kafka` source also gets `TABLE_DAEMON_CONF`'s `spark.driver.extraJavaOptions` "
        "(the serial collector, 10-20 % of the heap free after a collection; docs/architecture.md, "
        "\"Table backfill\")."))
    tables: bool = Field(default=False, description=(
        "Start Spark in a daemon of `delta` sources alone, so that their large snapshot and chain copies "
        "run on it (`sources[].spark_copy_rows`); without it such a daemon starts no JVM and copies on the "
        "driver. A daemon with a `kafka` source always runs Spark."))


#: Names the API always serves: a browser names them only for a page on this machine's loopback.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")


def normalize_host(entry: str) -> str | None:
    """A host name or IP address as compared with a ``Host`` header (lower case, IPv6 without brackets).

    ``"*"`` and ``"*.domain"`` are kept as they are; None when ``entry`` is none of these (a port, a
    scheme, a path, spaces).
    """
    name = entry.strip().lower().rstrip(".")
    if name == "*":
        return name
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        pass
    return name if _HOST_NAME.fullmatch(name) else None


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == "*"


class ApiConfig(_Frozen):
    """The HTTP control API's bind address, token and request limits."""

    host: str = Field(default="127.0.0.1", description=(
        "The control API's bind address; a non-loopback host needs a token (or "
        "`api.allow_unauthenticated = true`)."))
    port: int = Field(default=8080, ge=0, le=65535, description="The control API's port.")
    token: SecretStr | None = Field(default=None, description=(
        "When set, mutating calls need `Authorization: Bearer <token>`; compared in constant time, never "
        "logged or echoed."))
    token_file: Path | None = Field(default=None, description=(
        "Read the token from this file instead (a mounted secret; read once at start, surrounding "
        "whitespace stripped), so it is never on a command line. Exclusive with `token`."))
    guard_reads: bool = Field(default=False, description=(
        "The job reads and `/metrics` on the API port need the token too (`/health`, `/ready`, `/live` "
        "never do; a separate `metrics.port` is not guarded). Always on with `principals_file` or `oidc`."))
    principals_file: Path | None = Field(default=None, description=(
        "Principals with roles per namespace, each by its token's SHA-256 (a JSON or YAML file: "
        "docs/security.md, \"Sharing one daemon\"); read at start and again on SIGHUP (a file that does not "
        "load keeps the previous set). With it (or `oidc`) every route needs a credential and a principal "
        "sees only its namespaces' jobs; `token` stays an admin of all."))
    oidc: OidcConfig | None = Field(default=None, description=(
        "Accept OIDC bearer tokens (JWT) of this issuer, their roles in a claim (`api.oidc.*`)."))
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description=(
        "Larger request bodies get 413 before they are read."))
    allow_unauthenticated: bool = Field(default=False, description=(
        "Serve a non-loopback address without a token (anyone who reaches the port may drop jobs)."))
    allowed_hosts: list[str] = Field(default_factory=list, description=(
        "Host names (or IPs, `\"*.domain\"` for its subdomains) a request's `Host` may name besides the "
        "loopback names and a non-wildcard `api.host`, any port; others get 421 (not `/live`, `/ready`). "
        "`\"*\"`: any (no DNS-rebinding defence). Env: JSON, "
        "`SOURCE_BACKFILL_API__ALLOWED_HOSTS='[\"api.example.com\"]'`."))
    header_timeout_s: float = Field(default=5.0, gt=0, le=300, description=(
        "A connection that has not sent a request's complete headers this long after it opened (or after "
        "its last response) is closed."))
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600, description=(
        "A request body not complete this long after its headers: the connection is closed."))
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=300, description=(
        "An idle kept-alive connection is closed after this long."))
    max_connections: int = Field(default=100, ge=2, le=10_000, description=(
        "Open connections at most, per port (API, metrics); a new one closes the one that has waited "
        "longest for its client's headers or body, or gets 503 when the daemon is working on a request on "
        "every one."))
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1 << 20, description=(
        "A request line and headers still incomplete past this many bytes: 400, connection closed (h11 "
        "measures what it holds unparsed: headers that arrive whole in one read of up to 256 KiB pass)."))

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        names = []
        for entry in value:
            name = normalize_host(entry)
            if name is None:
                msg = (f"api.allowed_hosts: {entry!r} is not a host name, an IP address, \"*.domain\" or "
                       "\"*\" (give names without scheme or port)")
                raise ValueError(msg)
            names.append(name)
        return names

    @property
    def served_hosts(self) -> tuple[str, ...]:
        """What the ``Host`` header of a request may name: loopback, the bind host, ``allowed_hosts``."""
        hosts = list(LOOPBACK_HOSTS)
        bind = normalize_host(self.host)
        if bind is not None and not _is_wildcard(bind):
            hosts.append(bind)
        hosts += self.allowed_hosts
        return tuple(dict.fromkeys(hosts))

    @model_validator(mode="after")
    def _token_from_file(self) -> ApiConfig:
        if self.token_file is None:
            return self
        if self.token is not None:
            msg = "set api.token or api.token_file, not both"
            raise ValueError(msg)
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"api.token_file {self.token_file} cannot be read: {type(exc).__name__}"
            raise ValueError(msg) from None
        if not text:
            msg = f"api.token_file {self.token_file} is empty"
            raise ValueError(msg)
        object.__setattr__(self, "token", SecretStr(text))  # frozen model: set once, while validating
        return self

    @model_validator(mode="after")
    def _token_not_empty(self) -> ApiConfig:
        # An empty token would be compared with the empty credentials of a request that sends none.
        if self.token is not None and not self.token.get_secret_value().strip():
            msg = "api.token is empty: set a token, or leave it unset"
            raise ValueError(msg)
        return self

    @property
    def tenants(self) -> bool:
        """Whether principals other than the one token are configured (roles per namespace)."""
        return self.principals_file is not None or self.oidc is not None

    @property
    def guarded(self) -> bool:
        """Whether any credential is configured (else every route is open, as on a laptop)."""
        return self.token is not None or self.tenants

    @model_validator(mode="after")
    def _guarded_reads_need_a_token(self) -> ApiConfig:
        if self.guard_reads and not self.guarded:
            msg = "api.guard_reads needs api.token, api.token_file, api.principals_file or api.oidc"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _no_open_api_on_the_network(self) -> ApiConfig:
        loopback = self.host in ("localhost", "::1") or self.host.startswith("127.")
        if not loopback and not self.guarded and not self.allow_unauthenticated:
            msg = (f"api.host {self.host} is reachable from other machines but api.token is not set: set "
                   "a token (SOURCE_BACKFILL_API__TOKEN), or api.allow_unauthenticated = true")
            raise ValueError(msg)
        return self


class MetricsConfig(_Frozen):
    """The Prometheus endpoint, and which splits get series of their own."""

    port: int | None = Field(default=9108, ge=0, le=65535, description=(
        "The Prometheus port (`/metrics` is also on the API port); `false` (env: `off`) to serve it there "
        "only. Serves `GET /metrics` only, with the `api.*` connection limits, any `Host`."))
    per_split: Literal["auto", "always", "never"] = Field(default="auto", description=(
        "Which splits get series of their own (`history_rows`, `live_rows`, `split_stage`, "
        "`split_lag_offsets`, `data_loss_offsets`): `auto` = those not Finished and those with data loss, "
        "at most `per_split_max` per job (data loss first, then the most lagging; series of a split that "
        "no longer qualifies are removed); `always` = every split (4 series per split: 40,000 for a job on "
        "10,000 partitions); `never`. Job-level series (`job_*`) always; every split in "
        "`GET /jobs/{name}`."))
    per_split_max: int = Field(default=50, ge=0, le=100_000, description="The cap of `auto`, per job.")

    def per_split_policy(self) -> PerSplit:
        """The policy ``source_backfill.metrics`` applies (``metrics.configure_per_split``)."""
        from source_backfill.metrics import PerSplit

        return PerSplit(self.per_split, self.per_split_max)

    @field_validator("port", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        # true would be port 1: say what is meant instead
        return _off_or(value, "metrics.port is a port number, or false to serve /metrics on the API port "
                              "only")


class DaemonConfig(_Frozen):
    """Process-wide settings."""

    state_root: Path = Field(default=Path("var/state"), description=(
        "Root of everything the daemon persists: the mutation log, streaming checkpoints, the embedded "
        "broker's log (made `0700`; no job's `sink_path` may overlap it)."))
    shutdown_timeout_s: float = Field(default=30.0, gt=0, description=(
        "How long SIGTERM waits for the running epoch (never half-committed). Send it to the daemon's "
        "process alone, as Docker and Kubernetes do (under systemd: `KillMode=mixed`): a SIGTERM to its "
        "whole process group stops Spark's JVM under the epoch, and the daemon then reports a dead JVM and "
        "exits 70."))
    data_root: Path | None = Field(default=None, description=(
        "When set, every job's `sink_path` must resolve inside it (no `..`, no symlink out): API creates "
        "elsewhere get 422."))
    stale_after_intervals: float = Field(default=60.0, gt=1, description=(
        "A source whose last epoch is older than this many trigger intervals is unhealthy."))
    quarantine_after_crashes: int = Field(default=3, ge=1, description=(
        "A job whose Spark work was in flight at this many deaths of Spark's JVM in a row (seen by the "
        "daemon's watchdog) is failed as `quarantined` at the next start, before it runs again, until it "
        "is retried."))
