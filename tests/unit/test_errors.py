"""One line per error, whatever Spark wrapped around it."""

from __future__ import annotations

from source_backfill.errors import one_line

WRAPPED = (
    "[STREAM_FAILED] Query [id = 1] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An "
    "error occurred. Return Message: Traceback (most recent call last):\n"
    '  File "source.py", line 3, in _on_batch\n'
    "    raise RuntimeError('boom')\n"
    "RuntimeError: the live batch failed\n"
    "\n\tat org.apache.spark.Something(Something.scala:1)\n"
)


def test_the_python_cause_comes_first_then_the_wrapper():
    line = one_line(Exception(WRAPPED))
    assert line.startswith("RuntimeError: the live batch failed ([STREAM_FAILED] Query")
    assert "\n" not in line


def test_the_readers_data_loss_line_names_split_and_offsets():
    text = ("Py4JJavaError: ...\n  ...\n"
            "DataLossError: data loss on Kafka split t:0: offsets 5..9 are gone\nmore")
    assert one_line(Exception(text)) == "data loss on Kafka split t:0: offsets 5..9 are gone"


def test_plain_errors_and_limits():
    assert one_line(ValueError("first\nsecond")) == "first"
    assert one_line(ValueError("")) == "ValueError"
    assert len(one_line(ValueError("x" * 900))) == 500


def test_a_py4j_error_is_said_by_the_jvm_exception_under_it():
    text = ("An error occurred while calling o559.parquet.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 "
            "failed 2 times, most recent failure: Lost task 0.1 (executor 1 exited caused by one of the "
            "running tasks)\n\tat org.apache.spark.scheduler.DAGScheduler.failJob(DAGScheduler.scala:1)\n")
    line = one_line(Exception(text))
    assert line.startswith("org.apache.spark.SparkException: Job aborted due to stage failure: Task 0")
    assert line.endswith("(An error occurred while calling o559.parquet.)")
