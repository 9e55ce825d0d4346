"""Sizes, durations and the rules a dataset declaration must follow."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from combined.config import (
    CursorConfig,
    DatasetConfig,
    format_duration,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1024, 1024),
        ("10", 10),
        ("512B", 512),
        ("64MiB", 64 * 1024**2),
        ("20GiB", 20 * 1024**3),
        ("1TiB", 1024**4),
        ("2KiB", 2048),
        ("20GB", 20_000_000_000),
        ("5 MB", 5_000_000),
        ("3kb", 3000),
        ("1.5GiB", 1536 * 1024**2),
    ],
)
def test_sizes(text: int | str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "5XB", "MiB", "-1GiB", "1,000", True])
def test_bad_sizes(text: Any) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "duration"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1w", timedelta(weeks=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("1d 12h", timedelta(hours=36)),
    ],
)
def test_durations(text: str, duration: timedelta) -> None:
    assert parse_duration(text) == duration


@pytest.mark.parametrize("text", ["5", "h", "5 minutes", "-5m", "5M", "", "1h-"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(days=7), "7d"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(0), "0s"),
        (timedelta(days=1, seconds=1), "1d1s"),
        (timedelta(microseconds=100), "0.0001s"),
    ],
)
def test_durations_format_to_text_that_reads_back(duration: timedelta, text: str) -> None:
    assert format_duration(duration) == text
    assert parse_duration(text) == duration


def dataset(**fields: Any) -> DatasetConfig:
    return DatasetConfig.model_validate({"relation": "orders", **fields})


def test_a_single_key_column_becomes_a_list() -> None:
    assert dataset(key="id").key == ["id"]


def test_append_needs_no_key() -> None:
    assert dataset(sync_mode="append").key is None


@pytest.mark.parametrize("mode", ["incremental", "full_refresh"])
def test_merging_modes_need_a_key(mode: str) -> None:
    with pytest.raises(ValidationError, match="key is required"):
        dataset(sync_mode=mode)


def test_stream_names_the_relation_and_defaults_to_the_dataset() -> None:
    from combined.config import SourceConfig

    source = SourceConfig.model_validate(
        {
            "connector": "singer",
            "datasets": {
                "issues": {"key": ["id"], "stream": "gh_issues"},
                "users": {"key": ["id"]},
            },
        }
    )
    assert source.datasets["issues"].relation == "gh_issues"
    assert source.datasets["users"].relation == "users"
    with pytest.raises(ValidationError, match="stream"):
        SourceConfig.model_validate(
            {
                "connector": "singer",
                "datasets": {"a": {"key": ["id"], "stream": "s", "relation": "r"}},
            }
        )


@pytest.mark.parametrize(
    ("lookback", "value"),
    [(0, 0), (100, 100), (0.5, 0.5), ("5m", timedelta(minutes=5)), ("0s", timedelta(0))],
)
def test_lookback_is_cursor_units_or_a_duration(lookback: Any, value: Any) -> None:
    cursor = CursorConfig(column="id", lookback=lookback, trust="autoincrement")
    assert cursor.lookback == value
    assert type(cursor.lookback) is type(value)


def test_cursor_trust_must_be_stated() -> None:
    with pytest.raises(ValidationError, match="trust"):
        CursorConfig.model_validate({"column": "updated_at", "trust": "  "})


@pytest.mark.parametrize("strategy", ["cursor", "cdc"])
def test_only_snapshots_can_full_refresh(strategy: str) -> None:
    cursor = {"column": "id", "trust": "t"} if strategy == "cursor" else None
    with pytest.raises(ValidationError, match="full_refresh"):
        dataset(key="id", strategy=strategy, sync_mode="full_refresh", cursor=cursor)


def test_projection_must_keep_the_cursor_column() -> None:
    with pytest.raises(ValidationError, match="'updated_at'"):
        dataset(
            key="id",
            strategy="cursor",
            cursor={"column": "updated_at", "trust": "t"},
            columns=["id", "total"],
        )


def test_several_dataset_problems_are_all_reported() -> None:
    with pytest.raises(ValidationError) as info:
        dataset(strategy="cursor", sync_mode="full_refresh")
    context = info.value.errors()[0].get("ctx") or {}
    assert [problem[0] for problem in context["problems"]] == [
        ("key",),
        ("cursor",),
        ("sync_mode",),
    ]


def test_raw_validation_errors_do_not_show_config_values() -> None:
    from combined.config import SourceConfig

    with pytest.raises(ValidationError) as info:
        SourceConfig.model_validate({"connector": "x", "config": {"password": "hunter2"}})
    assert "hunter2" not in str(info.value)
    assert "password holds a literal secret" in str(info.value)


def test_dumps_keep_python_types_and_json_dumps_use_text() -> None:
    config = dataset(key="id", freshness="2h")
    assert config.model_dump()["freshness"] == timedelta(hours=2)
    assert config.model_dump(mode="json")["freshness"] == "2h"
    assert config.model_dump(mode="json")["quarantine"]["review_every"] == "7d"
