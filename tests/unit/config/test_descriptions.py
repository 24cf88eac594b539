"""Every field of every configuration model says what it is for: the docs' reference is generated from it.

``docs/gen.py`` writes the configuration reference from ``Field(description=...)`` (and the API schema
carries it to clients), so a field added without one would appear there as a bare name.
"""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, Field

from source_backfill import config


def config_models() -> list[type[BaseModel]]:
    """Every pydantic model ``source_backfill.config`` defines (``Settings`` and what it nests)."""
    return [value for value in vars(config).values()
            if inspect.isclass(value) and issubclass(value, BaseModel)
            and value.__module__.startswith(config.__name__) and value.model_fields]


def undescribed(models: list[type[BaseModel]]) -> list[str]:
    """``Model.field`` of every field without a description (or with only blanks)."""
    return [f"{model.__name__}.{name}" for model in models
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


def test_the_models_are_found():
    names = {m.__name__ for m in config_models()}
    assert {"Settings", "DaemonConfig", "SparkConfig", "ApiConfig", "MetricsConfig", "SourceConfig",
            "HistoryWidthConfig", "ArchiveConfig", "JobSpec", "EarliestStart", "OffsetsStart",
            "TimestampStart", "LatestStart", "RepairSpec"} <= names


def test_every_config_field_has_a_description():
    assert undescribed(config_models()) == [], "give these fields a Field(description=...)"


@pytest.mark.parametrize("annotation", ["plain", "field"])
def test_a_field_without_a_description_is_caught(annotation):
    class Described(config.ApiConfig):
        if annotation == "plain":
            extra_knob: int = 3
        else:
            extra_knob: int = Field(default=3, gt=0)

    assert undescribed([Described]) == ["Described.extra_knob"]
