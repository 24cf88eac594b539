"""What a job may be given: the checks a create, a throttle and a retry into a new table must pass.

Allow-lists, each refusal naming what it refused: a job's source must be configured (and, in a declared
namespace, one of the namespace's); its tables must lie inside the data root (and its namespace's folder
of it) and overlap neither the daemon's state nor another job's table (:mod:`.paths`); its namespace's
quotas (jobs, rate ceiling, bytes of the day) must have room. The registry (:mod:`.registry`) calls them
under its lock, with its job table, so that two creates that race cannot both pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from source_backfill import metrics
from source_backfill.config import JobSpec, NamespaceConfig
from source_backfill.errors import JobExistsError, QuotaExceededError, SinkPathError, SourceNotFoundError
from source_backfill.runtime.job_record import JobRecord
from source_backfill.runtime.mutation_log import LOG_NAME
from source_backfill.runtime.new_table import check_new_tables
from source_backfill.runtime.paths import check_sink_path, overlaps, readings, resolve, state_paths
from source_backfill.runtime.quotas import TableBytes

Jobs = Mapping[str, JobRecord]


def check_rate_ceiling(namespace: NamespaceConfig, rate_limit: float | None) -> None:
    """QuotaExceededError when a job of ``namespace`` would copy history faster than its ceiling allows."""
    ceiling = namespace.max_rate_limit
    if ceiling is not None and (rate_limit is None or rate_limit > ceiling):
        metrics.QUOTA_REFUSALS.labels(namespace.name, "max_rate_limit").inc()
        asked = "unlimited" if rate_limit is None else f"{rate_limit:g} rows/s"
        msg = (f'namespace "{namespace.name}" copies history at most {ceiling:g} rows/s per job '
               f"(max_rate_limit); asked {asked}")
        raise QuotaExceededError(msg, namespace.name)


@dataclass
class Admission:
    """The daemon's bounds on jobs: its sources, namespaces, data root and the paths no table may touch."""

    state_root: Path
    sources: frozenset[str]
    namespaces: Mapping[str, NamespaceConfig]
    #: When set, every job's tables must resolve (symlinks followed) inside it.
    data_root: Path | None = None
    #: Paths besides the state root no table may overlap (a delta source's table).
    protected_paths: list[Path] = field(default_factory=list)
    #: The bytes of the day of the namespaces that bound them; None: none does.
    table_bytes: TableBytes | None = None

    def check_new(self, spec: JobSpec, jobs: Jobs) -> None:
        """A create: a free name, a configured source, its namespace's bounds, its tables' paths."""
        current = jobs.get(spec.name)
        if current is not None and not current.dropped:
            msg = f'job "{spec.name}" already exists'
            raise JobExistsError(msg)
        if spec.source not in self.sources:
            msg = f'unknown source "{spec.source}" (configured: {sorted(self.sources)})'
            raise SourceNotFoundError(msg)
        namespace = self.namespaces.get(spec.namespace)
        if namespace is not None:
            self._check_namespace(spec, namespace, jobs)
        for table in spec.tables:  # its dead-letter table too: no other table may overlap it either
            self.check_sink_path(table, spec.name, jobs)

    def _check_namespace(self, spec: JobSpec, namespace: NamespaceConfig, jobs: Jobs) -> None:
        """The job keeps to its declared namespace: its sources, its folder of the data root, its quota."""
        if namespace.sources is not None and spec.source not in namespace.sources:
            msg = f'unknown source "{spec.source}"'  # the namespace's to know of, not the daemon's others
            raise SourceNotFoundError(msg)
        self.check_namespace_folder(spec, namespace)
        check_rate_ceiling(namespace, spec.rate_limit)
        if self.table_bytes is not None:
            self.table_bytes.check_create(namespace.name)
        if namespace.max_jobs is not None:
            live = sum(1 for r in jobs.values() if not r.dropped and r.spec.namespace == namespace.name)
            if live >= namespace.max_jobs:
                metrics.QUOTA_REFUSALS.labels(namespace.name, "max_jobs").inc()
                msg = (f'namespace "{namespace.name}" holds {live} jobs, its quota '
                       f"(max_jobs {namespace.max_jobs})")
                raise QuotaExceededError(msg, namespace.name)

    def check_namespace_folder(self, spec: JobSpec, namespace: NamespaceConfig) -> None:
        """The job's tables lie in its namespace's folder of the data root (when there is one)."""
        if self.data_root is None:
            return
        folder = self.data_root / namespace.folder
        for table in spec.tables:
            try:  # every place it may be opened at, as the data root's own check reads it
                places = readings(table)
            except (OSError, ValueError):
                continue  # not a usable path: check_sink_path refuses it, saying why
            if not all(place.is_relative_to(folder) for place in places):
                msg = (f"sink_path {table!r} is outside namespace {namespace.name!r}'s folder of the "
                       f"data root (daemon.data_root/{namespace.folder}/)")
                raise SinkPathError(msg)

    def check_new_table(self, spec: JobSpec, old: JobRecord, free: bool, jobs: Jobs) -> None:
        """A retried job's new tables: its namespace's folder, a create's path rules, none of its old ones."""
        namespace = self.namespaces.get(spec.namespace)
        if namespace is not None:
            self.check_namespace_folder(spec, namespace)
        protected = self.protected(spec.name, jobs)
        for table in old.spec.tables:
            try:
                protected.append((f'job "{old.name}"\'s old table', resolve(table)))
            except (OSError, ValueError):
                continue
        check_new_tables(spec, data_root=self.data_root, protected=protected, free=free)

    def check_sink_path(self, sink_path: str, name: str, jobs: Jobs) -> None:
        """A sink path must be inside ``data_root`` (if set) and disjoint from state and other tables.

        Allow-list reasoning (:mod:`source_backfill.runtime.paths`): the path is resolved as the sink
        opens it, then must be under the data root and overlap none of the protected paths: the state
        root, each state folder and file under it (resolved on its own), the configured protected paths,
        and every other registered job's table (one whose drop is pending too: it writes until then).
        """
        check_sink_path(sink_path, data_root=self.data_root, protected=self.protected(name, jobs))

    def protected(self, name: str, jobs: Jobs) -> list[tuple[str, Path]]:
        """What job ``name``'s tables may not overlap, each with what it is."""
        found = state_paths(self.state_root, self.sources, LOG_NAME)
        found += [("a protected path", p) for p in self.protected_paths]
        for record in jobs.values():
            if record.name != name:
                for table in record.spec.tables:
                    try:
                        found.append((f'job "{record.name}"\'s table', resolve(table)))
                    except (OSError, ValueError):
                        continue
        return found

    def protected_overlap(self, sink_path: str, name: str, jobs: Jobs) -> str | None:
        """What a registered job's sink overlaps among the daemon's state (not other jobs), else None."""
        try:
            sink = resolve(sink_path)
        except (OSError, ValueError):
            return None
        for what, path in self.protected(name, jobs):
            if not what.startswith("job ") and overlaps(sink, path):
                return f"{what} ({path})"
        return None
