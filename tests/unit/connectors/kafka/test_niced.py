"""The niced reader thread: items in order, errors raised in the caller, priority set, closing stops it."""

import os
import threading
import time

import pytest

from connectors.kafka.parquet_copy import niced


def test_yields_every_item_in_order_from_a_thread_at_the_given_niceness():
    seen = {}

    def produce():
        tid = threading.get_native_id()
        seen["tid"] = tid
        seen["niceness"] = os.getpriority(os.PRIO_PROCESS, tid)
        yield from range(100)

    before = os.getpriority(os.PRIO_PROCESS, 0)
    assert list(niced(produce, 7)) == list(range(100))
    assert seen["tid"] != threading.get_native_id()  # read in a thread of its own
    assert seen["niceness"] == max(before, 7)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # the calling thread (the worker) is untouched


def test_an_error_while_reading_is_raised_in_the_caller_after_the_items_before_it():
    def produce():
        yield 1
        yield 2
        msg = "broker gone"
        raise RuntimeError(msg)

    got = []
    with pytest.raises(RuntimeError, match="broker gone"):
        for item in niced(produce, 5):
            got.append(item)
    assert got == [1, 2]


def test_closing_early_stops_the_reading_thread():
    produced = []

    def produce():
        for i in range(10_000):
            produced.append(i)
            yield i

    gen = niced(produce, 5, depth=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    gen.close()
    time.sleep(0.5)
    assert len(produced) <= 3 + 2 + 2  # what was taken, what was queued, the one it waited to put
    assert not any(t.name == "kafka-reader-niced" and t.is_alive() for t in threading.enumerate())
