"""Fuzz the config loader: any TOML file and any ``SOURCE_BACKFILL_*`` environment either loads or raises
ConfigError (never another exception, so the CLI never shows a traceback for a bad config), and no
ConfigError message shows the secret in ``api.token`` or in a source's ``kafka`` options (a client secret:
SASL passwords go in files named by the ``security`` section, and a password put in ``kafka`` is refused
without being shown)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from source_backfill.config import Settings, load_settings
from source_backfill.errors import ConfigError
from tests.budget import examples

FUZZ = settings(max_examples=examples(200), deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: Distinctive secrets, some with characters a message would escape (so both spellings are looked for).
TOKENS = ["tok-7f3a9c-hunter2-ZXQ", "p@ss wörd \"quoted\" 'single' \\ tab\tnl\n 🗝-Q9"]
PASSWORDS = ["pw-51be0d-correct-horse-QJX", "ünïcödé-pässwörd-🔑-\u00ff\u0100-K7"]


def spellings(secret: str) -> set[str]:
    return {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1],
            json.dumps(secret, ensure_ascii=False)[1:-1]}


def assert_loads_or_config_error(load, secrets: list[str]) -> None:
    """``load()`` returns Settings or raises ConfigError whose message shows none of ``secrets``."""
    try:
        result = load()
    except ConfigError as exc:
        message = str(exc)
        for secret in secrets:
            for spelled in spellings(secret):
                assert spelled not in message, f"secret shown: {message}"
        assert exc.__cause__ is None or not any(s in str(exc.__cause__) for s in secrets)
    else:
        assert isinstance(result, Settings)
        assert not any(t in repr(result) for t in TOKENS)  # the token is a SecretStr


# -- a small TOML writer (tomllib only reads) ---------------------------------------------------------
def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_doc(doc: dict) -> str:
    return "\n".join(f"{toml_str(k)} = {toml_value(v)}" for k, v in doc.items()) + "\n"


def base(token: object, password: object) -> dict:
    """A valid configuration (that of test_config.py) holding the two secrets."""
    return {
        "daemon": {"state_root": "/tmp/sb"},
        "api": {"port": 9000, "token": token},
        "sources": [{"name": "events", "topics": ["a", "b"], "trigger_interval_s": 0.5,
                     "kafka": {"client.id": "events", "sasl.oauthbearer.client.secret": password},
                     "security": {"protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-512", "username": "u",
                                  "password_file": "/run/secrets/kafka-password"}}],
        "jobs": [{"name": "copy", "source": "events", "sink_path": "/tmp/copy",
                  "start": {"kind": "timestamp", "timestamp_ms": 1700000000000}, "rate_limit": 500,
                  "transform": "SELECT key, value, partition, offset FROM {source}"}],
    }


# -- strategies -----------------------------------------------------------------------------------------
keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["name", "port", "token", "kind", "offsets", "topics", "topic_pattern", "host", "master",
                     "conf", "state_root", "data_root", "sink_path", "rate_limit", "transform", "start",
                     "guard_reads", "max_body_bytes", "allow_unauthenticated", "source", "writer", "mode"]),
)
scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=24),
    st.sampled_from(["", "events", "copy", "127.0.0.1", "0.0.0.0", "off", "false", "t:0", "earliest",  # noqa: S104
                     "latest", "offsets", "timestamp", "SELECT * FROM {source}", "..", "/", "-1", "1e400"]),
    st.dates(), st.datetimes(), st.times(),
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)
tokens = st.one_of(st.sampled_from(TOKENS), st.sampled_from(TOKENS).map(lambda t: [t]),
                   st.sampled_from(TOKENS).map(lambda t: {"value": t}), st.just(987654321987))
passwords = st.one_of(st.sampled_from(PASSWORDS), st.sampled_from(PASSWORDS).map(lambda p: [p]),
                      st.sampled_from(PASSWORDS).map(lambda p: {"value": p}))


def _slots(node: object) -> Iterator[tuple[object, object]]:
    """Every (container, key or index) in the document, nested ones included."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in list(items):
        yield node, k
        yield from _slots(v)


@st.composite
def mutated_configs(draw) -> dict:
    """The valid config with 0-4 edits: a value replaced or removed, an unknown key or element added."""
    doc = copy.deepcopy(base(draw(tokens), draw(passwords)))
    for _ in range(draw(st.integers(0, 4))):
        slots = list(_slots(doc))
        if not slots:
            break
        parent, key = draw(st.sampled_from(slots))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[key] = draw(values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.append(draw(values))
    return doc


random_configs = st.dictionaries(keys, values, max_size=6).map(lambda d: d | {"api": {"token": TOKENS[0]}})


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Exactly these ``SOURCE_BACKFILL_*`` variables (others of that prefix removed) for the block."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("SOURCE_BACKFILL_")]:
            if name != "SOURCE_BACKFILL_JARS":  # not a setting: where the JVM jars are
                mp.delenv(name)
        for name, value in values.items():
            mp.setenv(name, value)
        yield


# -- tests ----------------------------------------------------------------------------------------------
def test_the_generated_documents_are_toml(tmp_path):
    """The writer is right, so the fuzzing reaches the loader's validation, not only TOML's parser."""
    odd = {"": 1, "a.b": [1.5, -0.0, "x\x7fy"], "d": dt.date(2020, 1, 2)}
    doc = base(TOKENS[1], PASSWORDS[1]) | {"odd keys": odd}
    assert tomllib.loads(toml_doc(doc)) == doc
    path = tmp_path / "c.toml"
    path.write_text(toml_doc(base(TOKENS[1], PASSWORDS[1])), encoding="utf-8")
    with environment({}):
        settings_ = load_settings(path)
    assert settings_.api.token is not None and settings_.api.token.get_secret_value() == TOKENS[1]
    assert settings_.sources[0].kafka["sasl.oauthbearer.client.secret"] == PASSWORDS[1]


@pytest.mark.parametrize("key", ["sasl.password", "kafka.sasl.jaas.config", "ssl.truststore.location"])
def test_a_security_option_in_kafka_is_refused_pointing_to_security_and_never_shown(tmp_path, key):
    doc = base(TOKENS[0], PASSWORDS[0])
    doc["sources"][0]["kafka"] = {key: PASSWORDS[1]}
    path = tmp_path / "c.toml"
    path.write_text(toml_doc(doc), encoding="utf-8")
    with environment({}), pytest.raises(ConfigError) as err:
        load_settings(path)
    assert "security section" in str(err.value) and key in str(err.value)
    assert PASSWORDS[1] not in str(err.value)


def test_any_mutation_of_a_valid_config_loads_or_is_a_config_error(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "config.toml"

    @FUZZ
    @given(doc=mutated_configs())
    def run(doc):
        path.write_text(toml_doc(doc), encoding="utf-8")
        with environment({}):
            assert_loads_or_config_error(lambda: load_settings(path), TOKENS + PASSWORDS)

    run()


def test_any_toml_document_loads_or_is_a_config_error(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "config.toml"

    @FUZZ
    @given(doc=random_configs)
    def run(doc):
        path.write_text(toml_doc(doc), encoding="utf-8")
        with environment({}):
            assert_loads_or_config_error(lambda: load_settings(path), TOKENS)

    run()


def test_any_file_content_loads_or_is_a_config_error(tmp_path_factory):
    """Broken TOML and bytes that are not UTF-8 are ConfigErrors too (not tomllib's or codecs' errors)."""
    path = tmp_path_factory.mktemp("fuzz") / "config.toml"
    valid = toml_doc(base(TOKENS[0], PASSWORDS[0])).encode()

    @FUZZ
    @given(cut=st.integers(0, len(valid)), junk=st.binary(max_size=8), drop=st.integers(0, 8))
    @example(cut=len(valid), junk=b"[api\n", drop=0)
    @example(cut=0, junk=b"\xff\xfe", drop=0)
    def run(cut, junk, drop):
        path.write_bytes(valid[:cut] + junk + valid[cut + drop:])
        with environment({}):
            assert_loads_or_config_error(lambda: load_settings(path), TOKENS + PASSWORDS)

    run()


ENV_NAMES = [
    "API__TOKEN", "API__PORT", "API__HOST", "API__GUARD_READS", "API__MAX_BODY_BYTES",
    "API__ALLOW_UNAUTHENTICATED", "API__BOGUS", "API__TOKEN__X", "API", "METRICS__PORT", "METRICS",
    "DAEMON__STATE_ROOT", "DAEMON__DATA_ROOT", "DAEMON__SHUTDOWN_TIMEOUT_S", "DAEMON", "SPARK__MASTER",
    "SPARK__CONF", "SPARK__CONF__spark.x", "SOURCES", "JOBS", "BOGUS",
]
env_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=24)
env_values = st.one_of(
    env_text,
    st.text(st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF), min_size=1, max_size=3),  # not UTF-8
    values.map(lambda v: json.dumps(v, default=str)),
    st.sampled_from(["", " ", "0", "-1", "65536", "true", "off", "null", "[]", "{}", "[{}]", "{", "nan"]),
)


@st.composite
def environments(draw) -> dict[str, str]:
    env = {f"SOURCE_BACKFILL_{n}": v for n, v in draw(st.dictionaries(st.sampled_from(ENV_NAMES), env_values,
                                                                     max_size=4)).items()}
    if draw(st.booleans()):
        env["SOURCE_BACKFILL_API__TOKEN"] = draw(st.sampled_from(TOKENS))
    if draw(st.booleans()):
        sources = mutated_configs().map(lambda d: d.get("sources"))
        env["SOURCE_BACKFILL_SOURCES"] = json.dumps(draw(sources), default=str)
    return env


def test_any_environment_loads_or_is_a_config_error(tmp_path_factory):
    """Over the valid file or none: the environment overrides it, by the same rules."""
    path = tmp_path_factory.mktemp("fuzz") / "config.toml"
    path.write_text(toml_doc(base(TOKENS[0], PASSWORDS[0])), encoding="utf-8")

    @FUZZ
    @given(env=environments(), with_file=st.booleans())
    @example(env={"SOURCE_BACKFILL_SOURCES": "["}, with_file=False)
    @example(env={"SOURCE_BACKFILL_API": '{"token": "' + TOKENS[0] + '", '}, with_file=True)
    @example(env={"SOURCE_BACKFILL_API__TOKEN": "tok-\udcff-" + TOKENS[0]}, with_file=False)
    def run(env, with_file):
        with environment(env):
            assert_loads_or_config_error(lambda: load_settings(path if with_file else None),
                                         [*TOKENS, *PASSWORDS, "tok-\udcff-" + TOKENS[0]])

    run()


# -- what the fuzzing found (each was another exception, a secret shown, or a config that loaded) ---------
@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"[api\nport = 1\n", "not valid TOML"), (b"\xff\xfe[api]\n", "not valid TOML"),
     (b'[api]\nport = 1\n[api]\nhost = "x"\n', "not valid TOML")],
    ids=["unclosed-table", "not-utf8", "table-twice"],
)
def test_a_file_that_is_not_toml_is_a_config_error(tmp_path, content, needle):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with environment({}), pytest.raises(ConfigError, match=needle):
        load_settings(path)


def test_an_environment_value_that_is_not_json_is_a_config_error():
    with environment({"SOURCE_BACKFILL_API": '{"token": "' + TOKENS[0] + '", '}), \
            pytest.raises(ConfigError, match='field "api"') as info:
        load_settings()
    assert TOKENS[0] not in str(info.value)


def test_a_misspelled_secret_key_does_not_show_its_value(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[api]\ntokn = "{TOKENS[0]}"\n', encoding="utf-8")
    with environment({}), pytest.raises(ConfigError, match="api.tokn") as info:
        load_settings(path)
    assert TOKENS[0] not in str(info.value)


@pytest.mark.parametrize("token", ["", "  "])
def test_an_empty_token_is_refused(token):
    """It would have let through every request that sends no credentials."""
    with environment({"SOURCE_BACKFILL_API__TOKEN": token}):
        with pytest.raises(ConfigError, match="api.token is empty"):
            load_settings()


def test_a_token_that_is_not_utf8_is_refused_unshown():
    """Environment bytes that are not UTF-8 arrive as lone surrogates; the API could not encode the token."""
    with environment({"SOURCE_BACKFILL_API__TOKEN": "tok-\udcff-" + TOKENS[0]}), \
            pytest.raises(ConfigError, match="api.token: text is not valid Unicode") as info:
        load_settings()
    assert TOKENS[0] not in str(info.value)


def test_a_path_with_a_nul_byte_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[daemon]\nstate_root = "/var/sb\\u0000x"\n', encoding="utf-8")
    with environment({}), pytest.raises(ConfigError, match="state_root: a path cannot hold a NUL byte"):
        load_settings(path)
