"""Checking a job's table against its source: exactly once, offset by offset (Kafka) or row by row (tables).

* :mod:`.kafka_job` — a Kafka job's table against the log (and its source's archive below the log start),
  up to what the job committed: ``source-backfill verify``, ``POST /jobs/{name}/verify``; streamed.
  :mod:`.content` compares the records' contents where the table keeps them; :mod:`.results` is what
  a run found.
* :mod:`.table_job` — a table job's table against its source table at the version it follows.
* :mod:`.log_check` — the test kit's whole-log checker (:func:`check_exactly_once`), in memory.

No Spark, and no code shared with what is checked (the layers contract: verify sits beside the executors).
"""

from source_backfill.verify.kafka_job import check_verifiable, committed_positions, verify_job
from source_backfill.verify.log_check import (
    Report,
    SplitCheck,
    check_exactly_once,
    compare,
    log_offsets,
    table_offsets,
)
from source_backfill.verify.results import SplitTally, VerifyResult
from source_backfill.verify.table_job import TableVerifyResult, table_job_version, verify_table_job

__all__ = [
    "Report",
    "SplitCheck",
    "SplitTally",
    "TableVerifyResult",
    "VerifyResult",
    "check_exactly_once",
    "check_verifiable",
    "committed_positions",
    "compare",
    "log_offsets",
    "table_job_version",
    "table_offsets",
    "verify_job",
    "verify_table_job",
]
