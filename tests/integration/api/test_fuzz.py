"""Fuzz the control API from its own OpenAPI schema against a real uvicorn server.

schemathesis generates requests from the served ``/openapi.json`` for every operation, schema-valid and
not, and runs all its checks on each answer: no 5xx, status code, content type, headers and body as the
schema declares them, schema-valid data accepted, invalid data refused, and a guarded call refused without
its token. We add: no traceback in any body. The same generated calls are sent again as another site's
page would send them: naming a Host the daemon does not serve (DNS rebinding; 421 on every operation but
the probes) and, for mutations, from a foreign Origin or with ``Sec-Fetch-Site: cross-site`` (403), token
or not. Hypothesis then throws invalid bodies and refused calls at a registry with a data root and checks
that a refused request changes nothing: not the job list, not one byte of the mutation log.

The schema is loaded inside the tests (not with ``schemathesis.pytest.from_fixture``: its lazy loader
sets ``request.node._nodeid``, which pytest 9.2 no longer has).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis import GenerationMode

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.config import TRANSFORM_PATTERN, JobSpec, SourceConfig
from source_backfill.runtime.progress import JobProgress, SplitProgress
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.source_reset import SourceResets
from source_backfill.runtime.verifications import Verifications
from tests.integration.api.conftest import SOURCES, TOKEN

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}

#: Every operation the API serves; test_the_schema_lists_every_operation fails when one is added.
OPERATIONS = [
    ("GET", "/health"), ("GET", "/ready"), ("GET", "/live"), ("GET", "/metrics"),
    ("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/jobs/{name}"), ("PATCH", "/jobs/{name}"),
    ("DELETE", "/jobs/{name}"), ("POST", "/jobs/{name}/pause"), ("POST", "/jobs/{name}/resume"),
    ("POST", "/jobs/{name}/retry"), ("POST", "/jobs/{name}/verify"), ("GET", "/jobs/{name}/verify/{run_id}"),
    ("POST", "/jobs/{name}/repair"), ("GET", "/audit"), ("GET", "/audit/refused"),
    ("POST", "/sources/{source}/reset"),
]
#: Operations whose schema cannot state every rule of a valid body, so a schema-valid body may be refused:
#: a repair's window must be non-empty (``from`` below ``to``), which JSON Schema cannot compare; a retry
#: into a new table is for a failed job, its ``sink`` a free path (the file system decides); a source is
#: reset only when stopped for good (and this API has no sources: 503). Those refusals are tested where the
#: rule is (tests/unit/config, tests/integration/daemon/test_repair.py, tests/integration/api/
#: test_start_over.py).
UNSTATED_RULES = {("POST", "/jobs/{name}/repair"), ("POST", "/jobs/{name}/retry"),
                  ("POST", "/sources/{source}/reset")}
OPERATION_IDS = [f"{m} {p}" for m, p in OPERATIONS]

#: Bounded and reproducible: a fixed sequence of examples, no per-example deadline (2 cores, a soak beside).
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
REFUSALS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
SEEDED, BROKEN = "seeded", "broken"


class _Checked:
    def to_json(self) -> dict:
        return {"ok": True, "summary": "exactly once, 0 records, 0 missing, 0 duplicated"}


def _verify_nothing(_job: str):
    """A verify run that checks nothing and passes (the fuzz is about the API, not the check)."""
    return _Checked


class _Running:
    """A source that runs (its reset is refused: 409)."""

    stopped_for_good = None


def _resets(registry: JobRegistry, state: Path) -> SourceResets:
    configs = {name: SourceConfig(name=name, bootstrap_servers="localhost:9092", topics=["t"])
               for name in SOURCES}
    running = {name: _Running() for name in SOURCES}
    return SourceResets(registry, state, configs, running, lambda _c: _Running())


class Served:
    def __init__(self, root: Path, token: str | None, data_root: Path | None = None) -> None:
        self.registry = JobRegistry(root / "state", SOURCES, data_root=data_root)
        secret = SecretStr(token) if token is not None else None
        app = create_app(self.registry, secret, health=lambda: {"ok": True},
                         verifications=Verifications(_verify_nothing),
                         reset_source=_resets(self.registry, root / "state").reset)
        self.server = ApiServer(app, "127.0.0.1", 0)
        self.server.start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)  # one: making one is not cheap

    @property
    def url(self) -> str:
        return self.server.url

    def seed(self) -> None:
        """A live job with progress and a failed one, so generated calls on them reach the 2xx paths."""
        live = {r.name for r in self.registry.list()}
        for name in (SEEDED, BROKEN):
            if name not in live:
                root = self.registry.data_root or Path("/tables")
                self.registry.create(JobSpec(name=name, source="events", sink_path=str(root / name)))
        self.registry.publish_progress(SEEDED, JobProgress(
            epoch=3, status="backfilling", rows_history=10, rows_live=2, eta_seconds=1.5,
            history_rows_per_s=20.0,
            splits=[SplitProgress("events:0", "backfilling", 9, 99, 10, 90),
                    SplitProgress("events:1", "finished", None, None, 0, 0)],
        ))
        if self.registry.get(BROKEN).error is None:
            self.registry.set_failed(BROKEN, "boom")

    def state(self) -> tuple[list, bytes]:
        """What a refused request must not change: the live jobs and the mutation log's bytes."""
        return self.registry.list(), self.registry.path.read_bytes()

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.registry.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    made: list[Served] = []

    def make(token: str | None = TOKEN, *, data_root: bool = False) -> Served:
        root = tmp_path_factory.mktemp("fuzz")
        data = root / "data" if data_root else None
        if data is not None:
            data.mkdir()
        made.append(Served(root, token, data))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def guarded(served) -> Served:
    return served()


@pytest.fixture(scope="module")
def open_api(served) -> Served:
    return served(None)


@pytest.fixture(scope="module")
def confined(served) -> Served:
    """A token and a data root: the most refusing configuration, for the refused-request tests."""
    s = served(data_root=True)
    s.seed()
    return s


def load(api: Served):
    return schemathesis.openapi.from_url(f"{api.url}/openapi.json")


def cases(operation, path: str):
    """Schema-valid and invalid requests; on /jobs/{name} also ones naming the two seeded jobs."""
    strategies = [operation.as_strategy(mode) for mode in GenerationMode]
    if "{name}" in path:
        strategies += [operation.as_strategy(mode, path_parameters={"name": name})
                       for mode in GenerationMode for name in (SEEDED, BROKEN)]
    if "{source}" in path:
        strategies += [operation.as_strategy(mode, path_parameters={"source": name})
                       for mode in GenerationMode for name in SOURCES]
    return st.one_of(strategies)


def fuzz(api: Served, method: str, path: str, headers: dict[str, str], **validate) -> None:
    operation = load(api)[path][method]
    if (method, path) in UNSTATED_RULES:
        validate.setdefault("excluded_checks", [schemathesis.checks.positive_data_acceptance])

    @FUZZ
    @given(case=cases(operation, path))
    def run(case):
        api.seed()
        if (method, path) == ("POST", "/jobs"):
            _named_in_its_namespace(case.body)
        response = case.call_and_validate(headers=headers, **validate)
        assert "Traceback" not in response.text

    run()


def _named_in_its_namespace(body: object) -> None:
    """A job of a namespace other than default is named ``<namespace>.<name>``: a rule relating two fields,
    which JSON Schema cannot state (its refusal: tests/integration/api/test_tenants.py). A generated body
    is made to keep it, so that every other rule of a create stays checked for schema-valid bodies."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return
    namespace = body.get("namespace")
    if not isinstance(namespace, str) or namespace == "default" or body["name"].startswith(f"{namespace}."):
        return
    if len(namespace) > 120:
        body["namespace"] = "default"
    else:
        body["name"] = f"{namespace}.{body['name']}"[:128]


def test_the_schema_lists_every_operation(guarded):
    found = sorted((r.ok().method.upper(), r.ok().path) for r in load(guarded).get_all_operations())
    assert found == sorted(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=OPERATION_IDS)
def test_every_operation_with_a_token(guarded, method, path):
    fuzz(guarded, method, path, AUTH)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=OPERATION_IDS)
def test_every_operation_without_a_token(open_api, method, path):
    """create_app(registry): no token, so the schema declares no security and nothing answers 401."""
    schema = load(open_api)
    assert "securitySchemes" not in schema.raw_schema.get("components", {})
    fuzz(open_api, method, path, {})


# -- a page on another site: foreign Host (DNS rebinding), foreign Origin (cross-site request forgery) ----
PROBES = {"/live", "/ready"}
MUTATING = [(m, p) for m, p in OPERATIONS if m != "GET"]
#: What every answer must still be: declared by the schema, in shape and status (the refusals are too).
SHAPE = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
         schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]
foreign_hosts = st.sampled_from(["evil.com", "evil.com:80", "127.0.0.1.evil.com", "localhost.evil.com:8080",
                                 "10.0.0.1", "[fd00::1]:8080"])
foreign_pages = st.one_of(
    st.sampled_from(["http://evil.com", "https://evil.com", "null", "http://127.0.0.1:1", "http://localhost",
                     "file://", "http://127.0.0.1.evil.com"]).map(lambda o: {"Origin": o}),
    st.sampled_from(["cross-site", "same-site"]).map(lambda s: {"Sec-Fetch-Site": s}),
)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=OPERATION_IDS)
def test_a_foreign_host_is_refused_on_every_operation_but_the_probes(guarded, method, path):
    """Schema-generated calls, valid and not, with the token, naming a Host the daemon does not serve."""
    operation = load(guarded)[path][method]

    @FUZZ
    @given(case=cases(operation, path), host=foreign_hosts)
    def run(case, host):
        guarded.seed()
        before = guarded.state()
        response = case.call(headers=AUTH | {"Host": host})
        case.validate_response(response, checks=SHAPE)
        if path in PROBES:
            assert response.status_code == 200, response.text
        else:
            assert response.status_code == 421, response.text
            assert response.json()["error"]["type"] == "host_not_allowed"
        assert guarded.state() == before

    run()


@pytest.mark.parametrize(("method", "path"), MUTATING, ids=[f"{m} {p}" for m, p in MUTATING])
def test_a_foreign_origin_is_refused_on_every_mutation(guarded, method, path):
    """Schema-generated mutations, valid and not, with the token, from another site's page: 403."""
    operation = load(guarded)[path][method]

    @FUZZ
    @given(case=cases(operation, path), page=foreign_pages)
    def run(case, page):
        guarded.seed()
        before = guarded.state()
        response = case.call(headers=AUTH | page)
        case.validate_response(response, checks=SHAPE)
        assert response.status_code == 403, response.text
        assert response.json()["error"]["type"] == "cross_origin"
        assert guarded.state() == before

    run()


# -- refused requests change nothing -------------------------------------------------------------------
bad_names = st.one_of(
    st.text(max_size=40).filter(lambda s: not NAME_RE.fullmatch(s)),
    st.sampled_from(["..", ".", "../etc", "a/b", "/", "-rf", ".hidden", "x" * 129, "naïve", "日本", "a b",
                     "a\nb", "ok\n", "\x00"]),
    st.integers(), st.none(), st.lists(st.just("a"), max_size=2), st.booleans(),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def good_body(data: Path) -> dict:
    return {"name": "fresh", "source": "events", "sink_path": str(data / "fresh")}


def invalid_bodies(data: Path) -> st.SearchStrategy:
    """Create bodies each of which must be refused (4xx), built by breaking one thing in a good body."""
    base = good_body(data)

    def with_(key: str, values: st.SearchStrategy) -> st.SearchStrategy:
        return values.map(lambda v: base | {key: v})

    return st.one_of(
        with_("name", bad_names),
        with_("name", st.just("seeded")),  # exists: 409
        with_("source", bad_names | st.just("nope")),  # invalid (422) or unknown (404)
        with_("sink_path", st.sampled_from(
            ["", "/etc/evil", "../escape", str(data / ".." / "escape"), "relative/t", "/tmp", "\x00",
             str(data / "a\x00b"), "s3://bucket/t"]) | st.integers() | st.none()),
        with_("start", st.one_of(
            json_values.filter(lambda v: not isinstance(v, dict)),
            st.just({"kind": "sometime"}), st.just({"kind": "offsets", "offsets": {"t0": 1}}),
            st.just({"kind": "offsets", "offsets": {"t:0": -1}}), st.just({"kind": "timestamp"}),
            st.just({"kind": "timestamp", "timestamp_ms": -5}), st.just({"kind": "earliest", "x": 1}),
        )),
        with_("rate_limit", st.one_of(st.floats(max_value=-1e-9), st.sampled_from(["fast", [], {}]))),
        with_("max_rows_per_epoch", st.integers(max_value=0) | st.just("many")),
        with_("transform", st.one_of(
            st.text(max_size=60).filter(lambda s: not re.match(TRANSFORM_PATTERN, s)),
            st.just("SELECT key FROM t"), st.just("DROP TABLE {source}"), st.integers(),
        )),
        with_("mode", st.text(max_size=10).filter(lambda s: s != "append")),
        with_("writer", st.text(max_size=10).filter(lambda s: s not in ("delta-rs", "delta-spark"))),
        with_("read_ahead", st.sampled_from(["maybe", 2, [], {}])),
        st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in base), json_values,
                        min_size=1, max_size=3).map(lambda extra: base | extra),  # unknown fields
        st.sampled_from(list(base)).map(lambda k: {x: v for x, v in base.items() if x != k}),  # one missing
        json_values.filter(lambda v: not isinstance(v, dict)),  # not an object at all
    )


raw_bodies = st.one_of(
    st.binary(max_size=64),  # mostly not JSON, sometimes not even UTF-8
    st.just(b'{"name": "fresh", "source": "events", "sink_path": "/x"'),  # cut short
    st.just(b'{"name": "fresh", "name": "x"' + b', "a": [' * 2000 + b"]" * 2000 + b"}"),  # deep nesting
)


def assert_refused(r: httpx.Response) -> None:
    if r.status_code == 307:  # a name holding "/" leaves a path Starlette redirects ("/jobs//" -> "/jobs/")
        return
    assert 400 <= r.status_code < 500, r.text
    assert "Traceback" not in r.text
    error = r.json()["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str)


def test_refused_creates_change_nothing(confined):
    data = confined.registry.data_root
    assert data is not None

    @REFUSALS
    @given(body=invalid_bodies(data), raw=st.none() | raw_bodies)
    # Found by this fuzzing, each a 500: a NUL byte in a sink path under a data root; a lone surrogate
    # (recorded, then unwritable as a response: GET /jobs failed until the job was dropped); infinity.
    @example(body=good_body(data) | {"sink_path": str(data / "a\x00b")}, raw=None)
    @example(body=good_body(data) | {"transform": "SELECT * FROM {source} -- \ud800"}, raw=None)
    @example(body=good_body(data) | {"start": {"kind": "offsets", "offsets": {"t\udc80:0": 1}}}, raw=None)
    @example(body=None, raw=b'{"name": "f", "source": "events", "sink_path": "/x", "rate_limit": Infinity}')
    def run(body, raw):
        before = confined.state()
        content = raw if raw is not None else json.dumps(body).encode()
        r = confined.client.post("/jobs", content=content, headers=AUTH | JSON)
        assert_refused(r)
        assert confined.state() == before
        assert confined.client.get("/jobs", headers=AUTH).status_code == 200  # nothing poisoned the list

    run()


def test_refused_job_calls_change_nothing(confined):
    """Unknown or invalid names, bad PATCH bodies, missing or wrong tokens: 4xx and nothing changed."""
    data = confined.registry.data_root
    assert data is not None
    routes = [("POST", "/jobs/{}/pause"), ("POST", "/jobs/{}/resume"), ("POST", "/jobs/{}/retry"),
              ("DELETE", "/jobs/{}"), ("PATCH", "/jobs/{}")]
    names = st.one_of(st.sampled_from([SEEDED, BROKEN]), st.text(min_size=1, max_size=30))
    header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)
    tokens = st.one_of(st.none(), header_text.filter(lambda t: t != TOKEN), st.just(TOKEN))
    patches = st.one_of(
        st.just({"rate_limit": -1}), st.just({"rate_limit": "fast"}), st.just({"rate_limit": 1, "x": 2}),
        st.just({}), json_values.filter(lambda v: not isinstance(v, dict)), st.just({"rate_limit": 1e400}),
        st.floats(max_value=-1e-9).map(lambda f: {"rate_limit": f}),
    )

    @REFUSALS
    @given(route=st.sampled_from(routes), name=names, token=tokens, patch=patches)
    def run(route, name, token, patch):
        method, template = route
        authorized = token == TOKEN
        known = name in (SEEDED, BROKEN)
        if authorized and known and method != "PATCH":
            return  # a real pause/resume/retry/drop of a live job: accepted, not a refusal
        before = confined.state()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        path = template.format(quote(name, safe=""))
        content = json.dumps(patch).encode() if method == "PATCH" else None
        if method == "PATCH" and "1e400" in json.dumps(patch):
            content = b'{"rate_limit": 1e400}'  # infinity: not JSON Python writes, but JSON it reads
        r = confined.client.request(method, path, content=content, headers=headers)
        assert_refused(r)
        if not authorized and "/" not in name and name not in (".", ".."):  # else no route: 404/405
            assert r.status_code == 401
        assert confined.state() == before

    run()


retry_attacks = st.one_of(
    st.sampled_from(["/etc/evil", "../escape", "DATA/../escape", "DATA/seeded", "DATA/seeded/x", "DATA",
                     "DATA/a\x00b", "s3://bucket/t", "", "relative/t", "/tmp"]).map(lambda s: {"sink": s}),
    st.dictionaries(st.sampled_from(["from", "new_table", "sink", "sink_path", "name", "x"]), json_values,
                    max_size=4),
    json_values.filter(lambda v: not isinstance(v, dict)),
)


def test_refused_retries_into_a_new_table_change_nothing(confined):
    """Bodies of ``POST /jobs/{name}/retry`` that must be refused: 4xx, and nothing changed."""
    data = confined.registry.data_root
    assert data is not None

    @REFUSALS
    @given(extra=retry_attacks, name=st.sampled_from([SEEDED, BROKEN]), whole=st.booleans())
    def run(extra, name, whole):
        if isinstance(extra, dict) and isinstance(extra.get("sink"), str):
            extra = {**extra, "sink": extra["sink"].replace("DATA", str(data))}
        sent = {"from": "earliest", "new_table": True, **extra} if whole and isinstance(extra, dict) \
            else extra
        if sent is None or (name == BROKEN and sent == {"from": "earliest", "new_table": True}):
            return  # a plain retry, or the failed job into its default new table: accepted
        before = confined.state()
        r = confined.client.post(f"/jobs/{name}/retry", content=json.dumps(sent).encode(),
                                 headers=AUTH | JSON)
        assert_refused(r)
        assert confined.state() == before

    run()


def test_a_refused_request_leaves_the_seeded_jobs_as_they_were(confined):
    """The state compared above is real: an accepted call does change it (so equality is not vacuous)."""
    before = confined.state()
    assert confined.client.post(f"/jobs/{SEEDED}/pause", headers=AUTH).status_code == 202
    assert confined.state() != before
    assert confined.client.post(f"/jobs/{SEEDED}/resume", headers=AUTH).status_code == 202


# -- what the fuzzing found -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "field"),
    [
        # a 500 (ValueError: embedded null byte) when a data root is set
        ('{"name": "n", "source": "events", "sink_path": "DATA/a\\u0000b"}', "sink_path"),
        # recorded, then a 500 writing the answer; GET /jobs failed the same way until the job was dropped
        ('{"name": "s", "source": "events", "sink_path": "DATA/s", '
         '"transform": "SELECT * FROM {source} \\ud800"}', "transform"),
        ('{"name": "k", "source": "events", "sink_path": "DATA/k", '
         '"start": {"kind": "offsets", "offsets": {"t\\udc80:0": 1}}}', "start.offsets.offsets"),
        # a 500: the mutation log refuses to write infinity
        ('{"name": "i", "source": "events", "sink_path": "DATA/i", "rate_limit": Infinity}', "rate_limit"),
        # accepted as 1 row/s
        ('{"name": "b", "source": "events", "sink_path": "DATA/b", "rate_limit": true}', "rate_limit"),
        # accepted; int("²") fails where a split id is parsed
        ('{"name": "d", "source": "events", "sink_path": "DATA/d", '
         '"start": {"kind": "offsets", "offsets": {"t:\\u00b2": 1}}}', "start.offsets.offsets"),
    ],
    ids=["nul-sink-path", "surrogate-transform", "surrogate-split", "infinite-rate", "bool-rate",
         "digit-split"],
)
def test_found_by_fuzzing_a_bad_create_is_a_422_and_changes_nothing(confined, raw, field):
    data = str(confined.registry.data_root)
    before = confined.state()
    r = confined.client.post("/jobs", content=raw.replace("DATA", data).encode(), headers=AUTH | JSON)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert confined.state() == before
    assert confined.client.get("/jobs", headers=AUTH).status_code == 200


def test_found_by_fuzzing_a_boolean_rate_limit_is_refused(confined):
    before = confined.state()
    for value in (b"true", b"false", b'"5"'):
        body = b'{"rate_limit": %s}' % value
        r = confined.client.patch(f"/jobs/{SEEDED}", content=body, headers=AUTH | JSON)
        assert r.status_code == 422, r.text
    assert confined.state() == before


def test_an_empty_token_opens_nothing(tmp_path):
    """The config refuses an empty api.token; the app does not let a request without credentials match it."""
    registry = JobRegistry(tmp_path / "state", SOURCES)
    with ApiServer(create_app(registry, SecretStr("")), "127.0.0.1", 0) as server:
        r = httpx.post(f"{server.url}/jobs", json={"name": "j", "source": "events", "sink_path": "/t/j"})
        assert r.status_code == 401
    assert registry.list() == []
    registry.close()
