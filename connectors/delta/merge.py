"""The delta-rs merge committer: an epoch's changelog merged into the table by key, in one commit.

A sink in merge mode (the table-backfill jobs) is handed changes, each row carrying its
:data:`CHANGE_TYPE`; ``insert`` and ``update_postimage`` upsert, ``delete`` deletes, ``update_preimage``
rows are ignored, and only the last change per key within the epoch counts (:func:`last_per_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from connectors.delta.committer import CommitResult, EpochWrite
from connectors.delta.log import KEY_ATTEMPT
from connectors.delta.table import is_arrow_table

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from connectors.delta.table import SinkTable

#: The column of a changelog row naming its change (``insert``, ``update_preimage``,
#: ``update_postimage``, ``delete``): Delta's change data feed's own.
CHANGE_TYPE = "_change_type"


class DeltaRsMerge:
    """Merge the epoch's changes by ``key_columns`` with delta-rs (merge mode, not new keys only)."""

    writes_before_commit = False
    direct = False

    def __init__(self, target: SinkTable, key_columns: tuple[str, ...]) -> None:
        self.target = target
        self.key_columns = key_columns

    def takes(self, df: DataFrame | pa.Table | None, *, new_keys_only: bool) -> bool:
        """Every epoch but one of inserts of keys the table does not hold (appended instead: no join)."""
        return not new_keys_only

    def commit(self, snapshot: DeltaTable | None, write: EpochWrite) -> CommitResult:
        """Keyed merge of a changelog (insert/update_postimage upsert, delete deletes).

        The epoch's changelog is collected to the driver as Arrow and merged by delta-rs in one commit
        carrying the same txn and metadata; only the last change per key within the epoch counts and
        ``update_preimage`` rows are ignored. No changes: an empty commit carrying txn and metadata.
        """
        from deltalake.transaction import CommitProperties, Transaction

        table = snapshot if snapshot is not None else self.target.snapshot()  # (given: not direct)
        epoch, df, meta = write.epoch, write.df, write.meta
        before = int(table.version())  # the snapshot of the replay check
        props = CommitProperties(custom_metadata=meta,
                                 app_transactions=[Transaction(self.target.job_id, epoch)])
        changes = None
        if is_arrow_table(df):
            import pyarrow as pa
            import pyarrow.compute as pc

            kept = pa.array(["insert", "update_postimage", "delete"])
            changes = self.target.conform_arrow(df, CHANGE_TYPE)
            changes = changes.filter(pc.is_in(changes.column(CHANGE_TYPE), value_set=kept))
        elif df is not None:
            from pyspark.sql import functions as F  # noqa: N812

            keep = F.col(CHANGE_TYPE).isin("insert", "update_postimage", "delete")
            changes = self.target.conform(df, CHANGE_TYPE).where(keep).toArrow()
        if changes is None or changes.num_rows == 0:
            table.create_write_transaction([], mode="append", schema=self.target.arrow_schema,
                                           commit_properties=props)
            rows = 0
        else:
            changes = last_per_key(changes, self.key_columns)
            cols = self.target.arrow_schema.names
            on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.key_columns)
            values = {c: f"s.`{c}`" for c in cols}
            (  # the changes are in memory already: not streamed, so delta-rs prunes target files by them
                table.merge(changes, predicate=on, source_alias="s", target_alias="t",
                            commit_properties=props, streamed_exec=False)
                .when_matched_delete(predicate=f"s.`{CHANGE_TYPE}` = 'delete'")
                .when_matched_update(values, predicate=f"s.`{CHANGE_TYPE}` != 'delete'")
                .when_not_matched_insert(values, predicate=f"s.`{CHANGE_TYPE}` != 'delete'")
                .execute()
            )
            rows = changes.num_rows
        table.update_incremental()
        version = self.target.own_version(table, meta.get(KEY_ATTEMPT), before)
        return CommitResult(epoch, True, version, 0, rows)


def last_per_key(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last change of each key (row order is the changelog order), in that order."""
    import numpy as np
    import pyarrow as pa

    n = changes.num_rows
    at = pa.array(np.arange(n, dtype=np.int64))
    last = (changes.select(list(keys)).append_column("__at", at)
            .group_by(list(keys), use_threads=False).aggregate([("__at", "max")]).column("__at_max"))
    keep = np.zeros(n, dtype=bool)
    keep[last.to_numpy()] = True  # a mask keeps the rows' order without sorting the positions
    return changes.filter(pa.array(keep))
