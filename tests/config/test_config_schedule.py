"""``schedule:``: validated when the project loads; its ticks, DST included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from combined.config import parse_project
from combined.config._schedule import ScheduleConfig
from combined.errors import ConfigError


def _project(schedule: Any, *, on_source: bool = False) -> dict[str, Any]:
    dataset: dict[str, Any] = {"key": ["id"]}
    source: dict[str, Any] = {"connector": "sqlite", "datasets": {"orders": dataset}}
    (source if on_source else dataset)["schedule"] = schedule
    return {"version": 1, "sources": {"shop": source}}


def test_schedules_load_on_a_dataset_and_on_a_source(tmp_path: Path) -> None:
    project = parse_project(
        _project({"cron": "0 3 * * *", "timezone": "Europe/Paris"}), tmp_path / "c.yaml"
    )
    own = project.dataset("shop", "orders").schedule
    assert own is not None and own.describe() == "cron 0 3 * * * (Europe/Paris)"
    project = parse_project(_project({"interval": "15m"}, on_source=True), tmp_path / "c.yaml")
    inherited = project.source("shop").schedule
    assert inherited is not None and inherited.interval == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("schedule", "where", "fragment", "hint"),
    [
        ({"cron": "0 25 * * *"}, "schedule.cron", "not a valid cron expression", "five fields"),
        ({"cron": "every day"}, "schedule.cron", "not a valid cron expression", "five fields"),
        ({"cron": "0 3 * * * *"}, "schedule.cron", "not a valid cron expression", "five"),
        (
            {"cron": "0 3 * * *", "timezone": "Mars/Olympus"},
            "schedule.timezone",
            "not a known time zone: 'Mars/Olympus'",
            "Europe/Paris",
        ),
        ({"cron": "0 3 * * *", "interval": "1h"}, "schedule", "sets both cron and interval", ""),
        ({}, "schedule", "sets neither cron nor interval", "interval: 15m"),
        ({"timezone": "UTC"}, "schedule", "sets neither cron nor interval", "cron"),
        ("0 3 * * *", "schedule", "must be a mapping", "cron"),
        ({"interval": 15}, "schedule.interval", "without a unit", "30s"),
        ({"interval": "500ms"}, "schedule.interval", "shorter than one second", "1s"),
        (
            {"interval": "1h", "timezone": "Europe/Paris"},
            "schedule.timezone",
            "sets a timezone for an interval",
            "remove `timezone:`",
        ),
        ({"every": "1h"}, "schedule.every", "is not a known key", ""),
    ],
)
def test_a_bad_schedule_is_refused_when_the_project_loads(
    tmp_path: Path, schedule: Any, where: str, fragment: str, hint: str
) -> None:
    """Each bad schedule stops the load with its location, the problem and what to write."""
    for on_source in (False, True):
        with pytest.raises(ConfigError) as info:
            parse_project(_project(schedule, on_source=on_source), tmp_path / "c.yaml")
        text = info.value.describe()
        prefix = "sources.shop." if on_source else "sources.shop.datasets.orders."
        assert f"{prefix}{where} " in str(info.value), text
        assert fragment in text, text
        assert hint in (info.value.hint or ""), text


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _ticks(schedule: ScheduleConfig, start: datetime, count: int) -> list[datetime]:
    ticks = [schedule.following(start)]
    while len(ticks) < count:
        ticks.append(schedule.following(ticks[-1]))
    return ticks


def test_cron_ticks_follow_the_wall_clock_of_their_time_zone_across_dst() -> None:
    """03:00 in Paris is 01:00 UTC in summer, 02:00 in winter; across the clock
    changes a daily job runs once a day: a skipped time (02:30 on the spring
    day) at the end of the gap, a repeated one (02:30 on the autumn day) once."""
    daily = ScheduleConfig(cron="30 2 * * *", timezone="Europe/Paris")
    assert _ticks(daily, _utc("2026-03-27 12:00"), 4) == [
        _utc("2026-03-28 01:30"),  # CET, +1
        _utc("2026-03-29 01:00"),  # 02:30 does not exist: 03:00 CEST
        _utc("2026-03-30 00:30"),  # CEST, +2
        _utc("2026-03-31 00:30"),
    ]
    assert _ticks(daily, _utc("2026-10-23 12:00"), 3) == [
        _utc("2026-10-24 00:30"),
        _utc("2026-10-25 00:30"),  # the first 02:30 only
        _utc("2026-10-26 01:30"),
    ]
    hourly = ScheduleConfig(cron="0 * * * *", timezone="Europe/Paris")
    assert _ticks(hourly, _utc("2026-10-24 22:30"), 4) == [
        _utc("2026-10-24 23:00"),  # 01:00 CEST
        _utc("2026-10-25 00:00"),  # 02:00 CEST; 02:00 CET is the same wall time: no tick
        _utc("2026-10-25 02:00"),  # 03:00 CET
        _utc("2026-10-25 03:00"),
    ]


@pytest.mark.parametrize(
    "schedule",
    [
        ScheduleConfig(cron="30 2 * * *", timezone="Europe/Paris"),
        ScheduleConfig(cron="*/20 * * * *", timezone="America/New_York"),
        ScheduleConfig(cron="0 * * * *", timezone="Europe/Paris"),
        ScheduleConfig(interval=timedelta(minutes=45)),
    ],
    ids=["daily-paris", "20min-new-york", "hourly-paris", "interval"],
)
def test_latest_is_the_newest_tick_that_following_counts(schedule: ScheduleConfig) -> None:
    """croniter's backward count disagrees with its forward one in a repeated
    hour: latest() must name exactly the tick following() counted, at any time."""
    for start in (_utc("2026-03-07 20:00"), _utc("2026-10-24 20:00"), _utc("2026-10-31 20:00")):
        ticks = _ticks(schedule, start, 12)
        # ~150 instants, none on a whole minute, some a microsecond from a tick
        step = (ticks[-1] - ticks[0]) / 150 + timedelta(seconds=7)
        instants = [ticks[0] + step * n for n in range(150)]
        instants += [t - timedelta(microseconds=1) for t in ticks[1:]] + ticks
        for now in instants:
            if now < ticks[-1]:
                assert schedule.latest(now) == max(t for t in ticks if t <= now), now


def test_interval_ticks_are_multiples_since_the_epoch() -> None:
    every = ScheduleConfig(interval=timedelta(minutes=15))
    assert every.latest(_utc("2026-01-01 10:07")) == _utc("2026-01-01 10:00")
    assert every.latest(_utc("2026-01-01 10:15")) == _utc("2026-01-01 10:15")
    assert every.following(_utc("2026-01-01 10:15")) == _utc("2026-01-01 10:30")
