"""What the checks share: how many offsets or keys a result names, and a Delta table's local folder."""

from __future__ import annotations

from typing import Any

#: Offsets (or keys) named per kind of difference in a result (the counts are always whole).
EXAMPLES = 5


def local_path(table: Any) -> str:  # noqa: ANN401 - a deltalake.DeltaTable
    """The local folder of a DeltaTable (its commit files are read one by one)."""
    uri = str(table.table_uri)
    return uri[len("file://"):] if uri.startswith("file://") else uri
