"""Everything together (:class:`Settings`): a TOML file, overridden by ``SOURCE_BACKFILL_*`` variables."""

from __future__ import annotations

import contextvars
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from source_backfill.config.access import NamespaceConfig
from source_backfill.config.daemon import ApiConfig, DaemonConfig, MetricsConfig, SparkConfig
from source_backfill.config.jobs import JobSpec, check_job_fits_source
from source_backfill.config.sources import SourceConfig
from source_backfill.errors import ConfigError

if TYPE_CHECKING:
    pass


_toml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("toml_file", default=None)


class Settings(BaseSettings):
    """Everything the daemon is configured with."""

    model_config = SettingsConfigDict(
        env_prefix="SOURCE_BACKFILL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    daemon: DaemonConfig = Field(default_factory=DaemonConfig, description="Process-wide settings.")
    spark: SparkConfig = Field(default_factory=SparkConfig, description="Where Spark runs, and its conf.")
    api: ApiConfig = Field(default_factory=ApiConfig, description=(
        "The HTTP control API: bind address, token, request limits."))
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description=(
        "The Prometheus endpoint, and which splits get series of their own."))
    sources: list[SourceConfig] = Field(default_factory=list, description=(
        "The shared live sources (`[[sources]]` in TOML), each fanned out to its jobs."))
    jobs: list[JobSpec] = Field(default_factory=list, description=(
        "Jobs the daemon starts with (`[[jobs]]`); jobs created through the API are kept in the mutation "
        "log."))
    namespaces: list[NamespaceConfig] = Field(default_factory=list, description=(
        "Tenants' namespaces (`[[namespaces]]`): the sources each may read, its folder of the data root, its "
        "quota (docs: \"Sharing one daemon\")."))

    @model_validator(mode="after")
    def _references(self) -> Settings:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            msg = f"duplicate source names: {names}"
            raise ValueError(msg)
        jobs = [j.name for j in self.jobs]
        if len(set(jobs)) != len(jobs):
            msg = f"duplicate job names: {jobs}"
            raise ValueError(msg)
        for job in self.jobs:
            if job.source not in names:
                msg = f'job "{job.name}" reads unknown source "{job.source}" (configured: {names})'
                raise ValueError(msg)
            check_job_fits_source(job, self.source(job.source))
        spaces = [n.name for n in self.namespaces]
        if len(set(spaces)) != len(spaces):
            msg = f"duplicate namespace names: {spaces}"
            raise ValueError(msg)
        for space in self.namespaces:
            unknown = sorted(set(space.sources or ()) - set(names))
            if unknown:
                msg = f'namespace "{space.name}" names unknown sources {unknown} (configured: {names})'
                raise ValueError(msg)
        return self

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``."""
        for source in self.sources:
            if source.name == name:
                return source
        msg = f'unknown source "{name}"'
        raise ConfigError(msg)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Precedence: explicit arguments, then the environment, then the TOML file."""
        toml = _toml_file.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (TOML) with environment overrides; raise ConfigError when invalid."""
    from pydantic import ValidationError

    toml = Path(path) if path is not None else None
    if toml is not None and not toml.is_file():
        msg = f"config file not found: {toml}"
        raise ConfigError(msg)
    token = _toml_file.set(toml)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        msg = f"invalid configuration{f' in {toml}' if toml else ''}:\n{describe_errors(exc)}"
        raise ConfigError(msg) from None  # pydantic's own text echoes inputs, secrets included
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # their text has a position, no content
        msg = f"config file {toml} is not valid TOML (UTF-8): {exc}"
        raise ConfigError(msg) from None
    except OSError as exc:
        msg = f"config file {toml} cannot be read: {exc.strerror or type(exc).__name__}"
        raise ConfigError(msg) from None
    except SettingsError as exc:  # a SOURCE_BACKFILL_* value that is not JSON; names the field, not the value
        msg = f"invalid configuration: {exc}"
        raise ConfigError(msg) from None
    finally:
        _toml_file.reset(token)


#: Fields whose values never appear in an error message.
_SECRET_FIELDS = frozenset({"token", "password", "secret", "sasl.password", "ssl.key.password"})


def validation_message(error: Mapping[str, Any]) -> str:
    """Pydantic's message for one error without its ``Value error, `` prefix (our messages stand alone)."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def describe_errors(exc: Any) -> str:
    """One line per invalid field: where, what is wrong, and the value given (secrets never shown)."""
    lines = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error.get("loc", ())) or "(root)"
        secret = any(str(p).lower() in _SECRET_FIELDS or "password" in str(p).lower()
                     for p in error.get("loc", ()))
        value = error.get("input")
        if secret or error.get("type") == "extra_forbidden":  # an unknown key may be a misspelled "token"
            given = "<hidden>"
        elif isinstance(value, dict | list):  # a whole section could hold a secret (kafka options)
            given = f"a {type(value).__name__}"
        else:
            given = repr(value)[:80]
        lines.append(f"  {loc}: {validation_message(error)} (got {given})")
    return "\n".join(lines)
