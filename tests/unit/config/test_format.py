"""``jobs[].format`` and ``sources[].schema_registry``: what a job may ask for, attacked.

A job is untrusted input: it chooses how its records are decoded, never where the registry is or which
file holds its password (the operator's source says that), so nothing in a job can make the daemon call a
URL or read a file of the job's choosing.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from source_backfill.config import JobSpec, SourceConfig, check_job_fits_source

REGISTRY = {"url": "http://registry:8081"}


def job(**fmt) -> JobSpec:
    return JobSpec(name="j", source="s", sink_path="/j", format=fmt)


def source(**kw) -> SourceConfig:
    return SourceConfig(**{"name": "s", "topics": ["orders"], "schema_registry": REGISTRY, **kw})


def test_raw_is_the_default_and_avro_decodes_by_the_sources_registry():
    assert JobSpec(name="j", source="s", sink_path="/j").format.value == "raw"
    spec = job(value="avro", evolution="pin", on_decode_error="dead_letter", reader_version=3)
    check_job_fits_source(spec, source())
    assert (spec.format.evolution, spec.format.on_decode_error, spec.format.reader_version) == (
        "pin", "dead_letter", 3)


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_json_and_protobuf_decode_by_the_sources_registry_as_avro_does_and_other_encodings_are_refused(
        encoding):
    spec = job(value=encoding, evolution="fail", subject="orders-value")
    check_job_fits_source(spec, source())
    assert (spec.format.value, spec.format.evolution, spec.format.subject) == (encoding, "fail",
                                                                               "orders-value")
    with pytest.raises(ValueError, match="needs a schema_registry"):
        check_job_fits_source(job(value=encoding), SourceConfig(name="s", topics=["t"]))
    for other in ("proto", "Protobuf", "JSON", "thrift", "", None, 1):
        with pytest.raises(ValidationError, match="format"):
            job(value=other)


@pytest.mark.parametrize(("fmt", "needle"), [
    ({"value": "avro", "registry": {"url": "http://evil"}}, "registry"),  # a job names no registry
    ({"value": "avro", "password_file": "/etc/shadow"}, "password_file"),
    ({"value": "proto3"}, "value"),
    ({"value": "avro", "key": "thrift"}, "key"),
    ({"value": "raw", "key": "avro"}, "key"),  # keys are decoded beside decoded values only
    ({"value": "avro", "key": "avro", "key_subject": ""}, "key_subject"),
    ({"value": "protobuf", "evolution": "guess"}, "evolution"),
    ({"value": "json", "evolution": "guess"}, "evolution"),
    ({"value": "avro", "evolution": "guess"}, "evolution"),
    ({"value": "avro", "on_decode_error": "skip"}, "on_decode_error"),
    ({"value": "avro", "reader_version": 0}, "reader_version"),
    ({"value": "avro", "reader_version": True}, "reader_version"),
    ({"value": "avro", "subject": ""}, "subject"),
    ({"value": "avro", "subject": "s" * 256}, "subject"),
    ({"value": "raw", "on_decode_error": "dead_letter"}, "on_decode_error"),  # an avro key on raw
    ({"value": "raw", "subject": "x"}, "subject"),
])
def test_a_format_a_job_may_not_ask_for_is_refused_saying_which_field(fmt, needle):
    with pytest.raises(ValidationError, match=needle):
        job(**fmt)


@pytest.mark.parametrize("url", [
    "file:///etc/passwd", "ftp://registry", "registry:8081", "http://", "http://a b", "http://a/?x=1",
    "javascript:alert(1)", "http://host/#frag",
])
def test_a_registry_url_is_an_http_url_and_nothing_else(url):
    with pytest.raises(ValidationError, match="url"):
        SourceConfig(name="s", topics=["t"], schema_registry={"url": url})


def test_registry_credentials_come_as_a_user_and_a_password_file_together():
    with pytest.raises(ValidationError, match="go together"):
        SourceConfig(name="s", topics=["t"], schema_registry={**REGISTRY, "username": "u"})
    with pytest.raises(ValidationError, match="password"):
        SourceConfig(name="s", topics=["t"], schema_registry={**REGISTRY, "password": "inline"})
    ok = SourceConfig(name="s", topics=["t"], schema_registry={**REGISTRY, "username": "u",
                                                                 "password_file": "/run/secrets/pw"})
    assert ok.schema_registry is not None and ok.schema_registry.username == "u"


@pytest.mark.parametrize(("spec", "src", "needle"), [
    (job(value="avro"), SourceConfig(name="s", topics=["t"]), "needs a schema_registry"),
    (job(value="avro"), source(topics=["a", "b"]), "format.subject is needed"),
    (job(value="avro"), source(topics=[], topic_pattern="o.*"), "format.subject is needed"),
    (JobSpec(name="j", source="s", sink_path="/j", writer="delta-spark", format={"value": "avro"}), source(),
     "delta-rs"),
    (JobSpec(name="j", source="s", sink_path="/j", strategy="snapshot", format={"value": "avro"}),
     SourceConfig(name="s", kind="delta", table_path="/t", primary_key=["id"]), "not rows of delta"),
])
def test_a_format_its_source_cannot_serve_is_refused(spec, src, needle):
    with pytest.raises(ValueError, match=needle):
        check_job_fits_source(spec, src)
    assert check_job_fits_source(job(value="avro", subject="orders-value"), source(topics=["a", "b"])) is None


def test_the_transform_of_a_decoding_job_is_not_changed_in_place():
    from source_backfill.errors import ConfigError
    from source_backfill.runtime.job_checks import check_retransform

    old = job(value="avro")
    new = old.model_copy(update={"transform": "SELECT id FROM {source}"})
    with pytest.raises(ConfigError, match="re-create the job"):
        check_retransform(None, old, new)
    check_retransform(None, job(), job())  # a raw job's is checked as before


def test_a_spark_failure_on_an_undecodable_record_becomes_the_jobs_decode_failure():
    from source_backfill.errors import DecodeFailedError
    from source_backfill.executors.decoding import DECODE_FAILURE, DECODE_FAILURE_END, decode_failure

    spark_text = (f"An error occurred while calling o1.save.\n: org.apache.spark.SparkRuntimeException: "
                  f"[USER_RAISED_EXCEPTION] {DECODE_FAILURE} the record at t:3 offset 99 cannot be decoded ( "
                  f"schema id 7 is unknown to the registry ) {DECODE_FAILURE_END} SQLSTATE: P0001\n\tat ...")
    failure = decode_failure("j", RuntimeError(spark_text))
    assert isinstance(failure, DecodeFailedError)
    assert str(failure).startswith('job "j": the record at t:3 offset 99 cannot be decoded (schema id 7 is '
                                   "unknown to the registry); format.on_decode_error")
    assert decode_failure("j", RuntimeError("the broker went away")) is None


def test_keys_decode_by_their_own_subject_and_one_is_named_when_the_source_has_several_topics():
    spec = job(value="avro", key="protobuf")
    assert (spec.format.key, spec.format.key_subject) == ("protobuf", None)
    check_job_fits_source(spec, source())
    several = SourceConfig(name="s", topics=["a", "b"], schema_registry=REGISTRY)
    with pytest.raises(ValueError, match="key_subject is needed"):
        check_job_fits_source(job(value="avro", key="avro", subject="a-value"), several)
    check_job_fits_source(job(value="avro", key="avro", subject="a-value", key_subject="a-key"), several)
    assert job(value="avro").format.key == "raw"
