"""The docs site's generated reference pages (``docs/gen.py``) hold every key, route and command."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from source_backfill.cli.parser import build_parser
from source_backfill.config import Settings
from tests.unit.config.test_descriptions import config_models

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(gen):
    return gen.pages()


def test_the_configuration_page_has_every_field_with_its_description(pages):
    text = pages["configuration.md"]
    for model in config_models():
        if model.__name__ in ("RepairSpec", "RetrySpec"):  # API bodies, not settings: the HTTP API page
            continue
        for name, field in model.model_fields.items():
            assert f"{name}`" in text, f"{model.__name__}.{name}"
            assert " ".join((field.description or "").split()) in text, f"{model.__name__}.{name}"
    for key in ("daemon.state_root", "api.allowed_hosts", "metrics.per_split_max",
                "sources[].archive.trusted", "sources[].history_width.min_duty",
                "jobs[].start.timestamp_ms", "jobs[].transform"):
        assert f"`{key}`" in text
    assert "env `SOURCE_BACKFILL_API__TOKEN`" in text
    assert "| `api.port`<br>env `SOURCE_BACKFILL_API__PORT` | int (≥ 0, ≤ 65,535) | `8080` |" in text
    assert set(Settings.model_fields) <= {line[4:].strip("`[]") for line in text.splitlines()
                                          if line.startswith("## ")}


def test_the_http_page_has_every_operation_and_schema_the_api_serves(pages):
    schema = json.loads(pages["openapi.json"])
    text = pages["http-api.md"]
    assert {"/jobs", "/jobs/{name}", "/jobs/{name}/repair", "/health", "/metrics"} <= set(schema["paths"])
    for path, item in schema["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text
    for name in schema["components"]["schemas"]:
        assert f"\n### {name}\n" in text
    assert "401" in text  # served with a token: the guarded operations say so
    assert "| `sink_path` | string | yes |" in text


def test_the_cli_page_has_every_command_and_option(pages):
    text = pages["cli.md"]

    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*words, name])

    commands = list(walk(build_parser(), ["source-backfill"]))
    assert len(commands) > 10
    for words, parser in commands:
        assert f"## `{' '.join(words)}`" in text
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert flag in text, (words, flag)


def test_the_cli_page_never_shows_the_builders_token(gen, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_API_TOKEN", "not-for-the-docs")
    monkeypatch.setenv("SOURCE_BACKFILL_API_URL", "http://builder.invalid:1")
    text = gen.cli_reference()
    assert "not-for-the-docs" not in text and "builder.invalid" not in text


def test_main_writes_the_pages(gen, tmp_path):
    gen.main(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.md", "configuration.md", "http-api.md",
                                                          "openapi.json"]
    assert (tmp_path / "configuration.md").read_text().startswith(gen.GENERATED)
