import pytest

from source_backfill.config import JobSpec, OffsetsStart, TimestampStart, load_settings
from source_backfill.errors import ConfigError

TOML = """
[daemon]
state_root = "/tmp/sb"

[api]
port = 9000

[[sources]]
name = "events"
topics = ["a", "b"]
trigger_interval_s = 0.5

[[jobs]]
name = "copy"
source = "events"
sink_path = "/tmp/copy"
start = { kind = "timestamp", timestamp_ms = 1700000000000 }
rate_limit = 500
transform = "SELECT key, value, partition, offset FROM {source}"
"""


def write(tmp_path, text=TOML):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_toml_file_loads_into_the_typed_model(tmp_path):
    s = load_settings(write(tmp_path))
    assert s.api.port == 9000
    assert s.source("events").topics == ["a", "b"]
    job = s.jobs[0]
    assert isinstance(job.start, TimestampStart) and job.start.timestamp_ms == 1700000000000
    assert job.rate_limit == 500


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_API__PORT", "7777")
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN", "s3cret")
    s = load_settings(write(tmp_path))
    assert s.api.port == 7777
    assert s.api.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)


def test_defaults_work_without_a_file():
    s = load_settings()
    assert s.spark.master == "local[*]"
    assert s.api.token is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (TOML.replace('source = "events"', 'source = "nope"'), 'unknown source "nope"'),
        (TOML.replace("port = 9000", "port = 99999"), "port"),
        (TOML.replace('name = "copy"', 'name = "bad name!"'), "name"),
        (TOML.replace("FROM {source}", "FROM t"), "{source}"),
        (TOML + "\n[bogus]\nx = 1\n", "bogus"),
    ],
)
def test_invalid_configuration_is_a_clear_config_error(tmp_path, text, needle):
    with pytest.raises(ConfigError, match="invalid configuration") as exc:
        load_settings(write(tmp_path, text))
    assert needle in str(exc.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_offsets_start_validates_split_ids():
    assert OffsetsStart(offsets={"t:0": 5}).offsets == {"t:0": 5}
    with pytest.raises(ValueError, match="topic:partition"):
        OffsetsStart(offsets={"t0": 5})
    with pytest.raises(ValueError, match="SELECT"):
        JobSpec(name="j", source="s", sink_path="p", transform="DROP TABLE {source}")


def test_metrics_port_can_be_turned_off_in_toml_and_env(tmp_path, monkeypatch):
    s = load_settings(write(tmp_path, "[metrics]\nport = false\n"))
    assert s.metrics.port is None
    for off in ("off", "null", "none", "false"):
        monkeypatch.setenv("SOURCE_BACKFILL_METRICS__PORT", off)
        assert load_settings().metrics.port is None
    monkeypatch.setenv("SOURCE_BACKFILL_METRICS__PORT", "9200")
    assert load_settings().metrics.port == 9200
    monkeypatch.delenv("SOURCE_BACKFILL_METRICS__PORT")
    with pytest.raises(ConfigError, match="false to serve /metrics on the API port only"):
        load_settings(write(tmp_path, "[metrics]\nport = true\n"))


def test_per_split_metrics_are_auto_capped_by_default_and_typed(tmp_path, monkeypatch):
    from source_backfill.metrics import PerSplit

    assert load_settings().metrics.per_split_policy() == PerSplit("auto", 50)
    s = load_settings(write(tmp_path, '[metrics]\nper_split = "always"\nper_split_max = 10\n'))
    assert s.metrics.per_split_policy() == PerSplit("always", 10)
    monkeypatch.setenv("SOURCE_BACKFILL_METRICS__PER_SPLIT", "never")
    assert load_settings().metrics.per_split == "never"
    monkeypatch.delenv("SOURCE_BACKFILL_METRICS__PER_SPLIT")
    with pytest.raises(ConfigError, match="metrics.per_split"):
        load_settings(write(tmp_path, '[metrics]\nper_split = "some"\n'))


def test_config_errors_never_show_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_API__PORT", "not-a-port")
    text = TOML.replace("[api]\nport = 9000\n", '[api]\nport = 9000\ntoken = ["s3cret-token"]\n')
    text += ('\n[[sources]]\nname = "x"\ntopics = ["t"]\n'
             'kafka = { "sasl.password" = ["hunter2"] }\nbogus = 1\n')
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    message = str(info.value)
    assert "api.port" in message and "'not-a-port'" in message  # the rest is still said plainly
    assert "api.token" in message and "s3cret" not in message and "hunter2" not in message
    assert info.value.__cause__ is None  # pydantic's text (which echoes inputs) is not chained


def test_the_api_refuses_the_network_without_a_token(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_API__HOST", "0.0.0.0")  # noqa: S104 - the case under test
    with pytest.raises(ConfigError, match="api.token is not set"):
        load_settings()
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN", "t0ken")
    assert load_settings().api.host == "0.0.0.0"  # noqa: S104
    monkeypatch.delenv("SOURCE_BACKFILL_API__TOKEN")
    monkeypatch.setenv("SOURCE_BACKFILL_API__ALLOW_UNAUTHENTICATED", "true")
    assert load_settings().api.token is None
    monkeypatch.setenv("SOURCE_BACKFILL_API__HOST", "127.0.0.2")
    monkeypatch.delenv("SOURCE_BACKFILL_API__ALLOW_UNAUTHENTICATED")
    assert load_settings().api.host == "127.0.0.2"  # loopback needs no token


def test_the_token_can_come_from_a_file_never_the_command_line(tmp_path, monkeypatch):
    secret = tmp_path / "token"
    secret.write_text("  from-a-file\n")
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN_FILE", str(secret))
    monkeypatch.setenv("SOURCE_BACKFILL_API__HOST", "0.0.0.0")  # noqa: S104 - a token makes it allowed
    api = load_settings().api
    assert api.token is not None
    assert api.token.get_secret_value() == "from-a-file"
    secret.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_settings()
    secret.unlink()
    with pytest.raises(ConfigError, match="cannot be read") as info:
        load_settings()
    assert str(secret) in str(info.value)
    secret.write_text("x")
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN", "also")
    with pytest.raises(ConfigError, match="not both"):
        load_settings()


def test_guarded_reads_need_a_token(monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_API__GUARD_READS", "true")
    with pytest.raises(ConfigError, match="guard_reads needs"):
        load_settings()
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN", "t")
    assert load_settings().api.guard_reads


def test_bootstrap_servers_can_name_an_environment_variable(tmp_path, monkeypatch):
    text = '[[sources]]\nname = "s"\ntopics = ["t"]\nbootstrap_servers = "${KAFKA_BOOTSTRAP_SERVERS}"\n'
    path = write(tmp_path, text)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(ConfigError, match=r"\$\{KAFKA_BOOTSTRAP_SERVERS\} but that environment variable"):
        load_settings(path)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    assert load_settings(path).sources[0].bootstrap_servers == "k1:9092,k2:9092"


ARCHIVE = TOML.replace("trigger_interval_s = 0.5",
                       'trigger_interval_s = 0.5\narchive = { path = "/data/bronze" }')


def test_an_archive_is_the_source_s_and_a_job_only_chooses_to_use_it(tmp_path):
    s = load_settings(write(tmp_path, ARCHIVE))
    archive = s.source("events").archive
    assert archive is not None and archive.path == "/data/bronze" and archive.trusted is False
    assert archive.check_offsets == 1000  # an untrusted archive is compared with Kafka where both hold
    assert s.jobs[0].history_source == "auto"
    with_job = ARCHIVE.replace("rate_limit = 500", 'rate_limit = 500\nhistory_source = "archive"')
    assert load_settings(write(tmp_path, with_job)).jobs[0].history_source == "archive"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # a job names where its history comes from, never a path: the archive is the operator's setting
        (TOML.replace("rate_limit = 500", 'rate_limit = 500\narchive = { path = "/etc" }'), "archive"),
        (TOML.replace("rate_limit = 500", 'rate_limit = 500\nhistory_source = "archive"'), "has no archive"),
        (ARCHIVE.replace("rate_limit = 500", 'rate_limit = 500\nhistory_source = "s3"'), "history_source"),
        (ARCHIVE.replace("rate_limit = 500", 'rate_limit = 500\nhistory_source = 1'), "history_source"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = ""'), "path"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = "/b", trusted = "yes please"'), "trusted"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = "/b", extra = 1'), "extra"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = "/b", check_offsets = -1'), "check_offsets"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = "/b", check_offsets = 1e12'), "check_offsets"),
        (ARCHIVE.replace('path = "/data/bronze"', 'path = "/b", check_offsets = "all"'), "check_offsets"),
        (ARCHIVE.replace('"/data/bronze"', '"/b", check_offsets = 10_000_001'), "check_offsets"),
    ],
)
def test_archive_settings_attacked_are_refused_saying_which(tmp_path, text, needle):
    with pytest.raises(ConfigError, match="invalid configuration") as exc:
        load_settings(write(tmp_path, text))
    assert needle in str(exc.value)


def test_a_delta_source_takes_no_archive_and_its_jobs_no_history_source():
    from source_backfill.config import SourceConfig, check_job_fits_source

    with pytest.raises(ValueError, match="archive"):
        SourceConfig(name="t", kind="delta", table_path="/t", primary_key=["id"], archive={"path": "/a"})
    table = SourceConfig(name="t", kind="delta", table_path="/t", primary_key=["id"])
    job = JobSpec(name="j", source="t", sink_path="/j", strategy="snapshot", history_source="kafka")
    with pytest.raises(ValueError, match="history_source is for kafka sources"):
        check_job_fits_source(job, table)


@pytest.mark.parametrize(("body", "words"), [
    ({}, "one window"),
    ({"from_offset": 1}, "one window"),
    ({"from_offset": 1, "to_offset": 5, "from_timestamp_ms": 1, "to_timestamp_ms": 9}, "one window"),
    ({"from_offset": 5, "to_offset": 5}, "empty"),
    ({"from_timestamp_ms": 9, "to_timestamp_ms": 2}, "empty"),
    ({"from_offset": -1, "to_offset": 5}, "greater than or equal"),
    ({"from_offset": True, "to_offset": 5}, "integer"),
    ({"from_offset": "1", "to_offset": 5}, "integer"),
    ({"splits": ["t:0", "t:0"], "from_offset": 0, "to_offset": 5}, "more than once"),
    ({"splits": ["t"], "from_offset": 0, "to_offset": 5}, "pattern"),
    ({"splits": ["t:0"] * 10_001, "from_offset": 0, "to_offset": 5}, "at most"),
    ({"from_offset": 0, "to_offset": 5, "sql": "x"}, "extra"),
])
def test_a_repair_s_window_is_refused_unless_it_is_one_non_empty_window(body, words) -> None:
    """Attacks on ``POST /jobs/{name}/repair``'s body: each refused, saying why."""
    from pydantic import ValidationError

    from source_backfill.config import RepairSpec

    with pytest.raises(ValidationError) as err:
        RepairSpec.model_validate(body)
    assert words in str(err.value).lower(), str(err.value)


def test_a_repair_window_in_offsets_or_timestamps() -> None:
    from source_backfill.config import RepairSpec

    assert not RepairSpec(from_offset=0, to_offset=1).by_timestamp
    assert RepairSpec(splits=["a:b:3"], from_timestamp_ms=0, to_timestamp_ms=1).by_timestamp


def test_a_source_s_archives_one_or_several_in_order_never_empty_or_twice() -> None:
    from pydantic import ValidationError

    from source_backfill.config import SourceConfig

    one = SourceConfig(name="s", topics=["t"], archive={"path": "/a"})
    assert [a.path for a in one.archives] == ["/a"]
    two = SourceConfig(name="s", topics=["t"], archive=[{"path": "/a"}, {"path": "/b", "trusted": True}])
    assert [(a.path, a.trusted) for a in two.archives] == [("/a", False), ("/b", True)]
    assert SourceConfig(name="s", topics=["t"]).archives == []
    for bad, words in (([], "empty"), ([{"path": "/a"}, {"path": "/a"}], "twice")):
        with pytest.raises(ValidationError, match=words):
            SourceConfig(name="s", topics=["t"], archive=bad)


@pytest.mark.parametrize(("value", "expected"), [("false", None), ('"off"', None), ("0", 0),
                                                 ("2000000", 2_000_000), (None, 250_000)])
def test_a_delta_source_copies_by_spark_from_a_row_count_or_never(tmp_path, value, expected):
    line = "" if value is None else f"spark_copy_rows = {value}\n"
    text = ('[[sources]]\nname = "t"\nkind = "delta"\ntable_path = "/tmp/t"\nprimary_key = ["id"]\n'
            + line + "[spark]\ntables = true\n")
    s = load_settings(write(tmp_path, text))
    assert s.source("t").spark_copy_rows == expected and s.spark.tables is True


@pytest.mark.parametrize("line", ["spark_copy_rows = true", "spark_copy_rows = -1", "spark_copy_rows = 1.5",
                                  'spark_copy_rows = "12"', "spark_copy_rows = 10_000_000_000_000_000",
                                  "spark_copy_epoch_rows = 0", "spark_copy_epoch_rows = true",
                                  'spark_copy_epoch_rows = "5"', "spark_copy_epoch_rows = 2.0"])
def test_a_copy_by_spark_refuses_what_is_not_a_row_count(tmp_path, line):
    text = f'[[sources]]\nname = "t"\nkind = "delta"\ntable_path = "/tmp/t"\nprimary_key = ["id"]\n{line}\n'
    with pytest.raises(ConfigError, match="spark_copy"):
        load_settings(write(tmp_path, text))


@pytest.mark.parametrize("value", ["0", "-5", "nan", '"abc"', "[]"])
def test_a_lag_bound_that_is_not_a_positive_number_of_seconds_is_refused(tmp_path, value):
    """``max_job_lag_s`` fails a lagging job: 0, a negative, NaN (never > 0) or no number would fail
    every job at its first skipped epoch, or none ever."""
    text = f'[[sources]]\nname = "t"\ntopics = ["x"]\nmax_job_lag_s = {value}\n'
    with pytest.raises(ConfigError, match="max_job_lag_s"):
        load_settings(write(tmp_path, text))
