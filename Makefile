# The two commands of the README are the contract: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= --durations=25
## make test's pytest-xdist workers (0: none). A file's tests stay on one worker (its module fixtures), and
## the files go out in collection order, so the crash suite (tests/chaos, ~8 min) starts first rather than
## last; each worker starts its own broker and Spark. Most tests wait on epochs and the broker, so two
## workers share the 2 cores well: 1,398 s -> 810 s for the suite here (2026-11-27).
TEST_WORKERS ?= 2
TEST_WORKERS_ARGS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: venv jars registry test-deps run run-table test test-busy test-properties test-slow test-containers unit integration lint docs bench bench-compare chaos clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev,bench]'
	touch $(STAMP)

## JVM parts pinned in deploy/jvm/pom.xml (Spark's Kafka connector, delta-spark, the Kafka broker), fetched
## from Maven once into var/jvm/ (SOURCE_BACKFILL_JARS overrides); a no-op when they are there.
jars: $(STAMP)
	$(PY) -m source_backfill.runtime.jvm fetch

## The Schema Registry the tests start (Apicurio Registry's Confluent-compatible API, in memory), built once
## from deploy/schema-registry/ with Maven into var/jvm/schema-registry/ (~300 jars from Maven Central the
## first time); a no-op while the sources are unchanged. The tests' schema_registry fixture builds it too.
registry: $(STAMP)
	$(PY) -m source_backfill.runtime.schema_registry build

## Run the daemon on the embedded default: broker, demo producer, one live job, a second job backfilling.
run: $(STAMP) jars
	$(PY) -m source_backfill.demo

## The whole test suite (unit + integration against a real broker, real Spark, real Delta tables), less the
## tests marked slow (the image's wheel install, the broker outages), to stay under 20 minutes on 2 cores;
## `make test-slow` runs those (CI runs both).
## The table-backfill demo: snapshot, arrangement and chain jobs copying a Delta table a writer keeps changing.
run-table: $(STAMP)
	$(PY) -m source_backfill.demo_table

## Debian packages some tests need (promtool, chromium, chromedriver): installed when root, else one line.
test-deps:
	bash deploy/ci/test-deps.sh

test: $(STAMP) jars test-deps
	$(PY) -m pytest -m "not slow and not containers" $(TEST_WORKERS_ARGS) $(PYTEST_ARGS)

## make test beside stress-ng --cpu 1 (one core kept busy), RUNS times (3): each run's time and result.
test-busy: $(STAMP) jars test-deps
	RUNS=$(or $(RUNS),3) bash deploy/ci/test-busy.sh

## The property tests (Hypothesis) with every example each names: make test runs a quarter (tests/budget.py).
test-properties: $(STAMP) jars
	SOURCE_BACKFILL_PROPERTY_EXAMPLES=full $(PY) -m pytest -m "not slow and not containers" $(TEST_WORKERS_ARGS) \
		$(PYTEST_ARGS) $$(grep -rl --include='test_*.py' '^from hypothesis' tests)

## The slow tier on make test's two workers (a file's tests on one): its tests mostly wait on brokers,
## clusters and restarts (12 min of CPU in 21 min of one worker, 2026-11-29), so two share the cores.
test-slow: $(STAMP) jars registry
	$(PY) -m pytest -m "slow and not containers" $(TEST_WORKERS_ARGS) $(PYTEST_ARGS)

## The container tests (tests/containers): the Dockerfile's image built and run, the compose stack up, the
## test kit's testcontainers path, with podman. Their first fixture runs deploy/containers/setup.sh: podman,
## runc and debootstrap from Debian's packages, the project's containers.conf, and the images no registry
## gives here, built once and kept (stand-ins named so). Needs root (else they skip, saying why).
test-containers: $(STAMP) jars
	$(PY) -m pytest -m containers tests/containers $(PYTEST_ARGS)

unit: $(STAMP) jars
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP) jars
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

## ruff, mypy strict on the core, and the layers (pyproject.toml's [tool.importlinter]: every import of
## source_backfill and connectors, lazy ones too, points down; docs/architecture.md, "Layers").
lint: $(STAMP)
	$(VENV)/bin/ruff check source_backfill connectors tests bench examples deploy docs
	$(VENV)/bin/mypy source_backfill connectors
	$(VENV)/bin/lint-imports --no-logo

## The documentation site (mkdocs.yml over docs/): the configuration, HTTP API and CLI references generated
## from the code into docs/reference/ (docs/gen.py), then built with --strict into site/ (a broken link or
## anchor fails; NO_MKDOCS_2_WARNING quiets Material's banner about MkDocs 2). `$(VENV)/bin/mkdocs serve`
## previews it once the references are generated.
docs: $(STAMP)
	$(PY) docs/gen.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## The crash suite as a soak: CYCLES kill/restart cycles of the daemon process, then exactly once.
## SECURED=1: against the embedded broker's SASL_SSL mode (SCRAM, a private CA, ACLs on).
CYCLES ?= 200
chaos: $(STAMP) jars
	$(PY) -m tests.chaos --cycles $(CYCLES) $(if $(SECURED),--secured) $(if $(CLUSTER),--cluster)

## Benchmarks print ratios against a baseline measured in the same run and merge their figures into
## bench/results/latest.json; BENCH_ARGS="--quick" is a smoke run, BENCH_ARGS="load" one module.
BENCH_ARGS ?=
bench: $(STAMP) jars
	$(PY) -m bench $(BENCH_ARGS)

## Two builds in one run: BASE (any git revision) checked out under var/bench-compare/<sha> (its own venv
## only if its dependencies differ), then BENCH's modules (or figure prefixes: startup is bench_trigger's)
## on base and head alternately, PAIRS pairs; per figure both medians, head/base, each side's spread and a
## verdict (a regression: every head run worse than every base run). The markdown table, for an issue's
## note, is written next to the runs' figures in var/bench-compare/runs/.
BASE  ?=
BENCH ?= startup backfill trigger
PAIRS ?= 3
bench-compare: $(STAMP) jars
	@test -n "$(BASE)" || { echo 'usage: make bench-compare BASE=<rev> [BENCH="startup backfill trigger"] [PAIRS=3]'; exit 2; }
	$(PY) -m bench.compare '$(BASE)' --bench '$(BENCH)' --pairs $(PAIRS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache var site docs/reference
