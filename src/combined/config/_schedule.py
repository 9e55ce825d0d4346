"""When a dataset is captured unattended: ``schedule:``, a cron expression or an interval.

A schedule names instants, its *ticks*. A cron expression's ticks are the
wall-clock times it matches in its ``timezone`` (UTC unless given); an
interval's ticks are the multiples of the interval since the Unix epoch, in
UTC, so that every scheduler process computes the very same ticks. The
scheduler (:mod:`combined.runtime._scheduler`) queues one capture per tick.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, PlainValidator, WithJsonSchema, model_validator

from combined.config._values import TEXT_SCHEMA, Duration, _error, _text, format_duration

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DST_MARGIN = timedelta(hours=2)
_CRON_HINT = (
    "write five fields, minute hour day-of-month month day-of-week, "
    'such as "0 3 * * *" (03:00 every day) or "*/15 * * * 1-5"'
)
_SHAPE_HINT = (
    'write `schedule: {cron: "0 3 * * *", timezone: Europe/Paris}` or `schedule: {interval: 15m}`'
)


def _cron(value: object) -> str:
    text = _text(value)
    if len(text.split()) != 5 or not croniter.is_valid(text):
        raise _error(f"is not a valid cron expression: {text!r}", _CRON_HINT)
    return text


def _zone(value: object) -> str:
    text = _text(value)
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise _error(
            f"is not a known time zone: {text!r}",
            "use an IANA time zone name such as UTC, Europe/Paris or America/New_York",
        ) from None
    return text


class ScheduleConfig(BaseModel):
    """A cron expression in a time zone, or an interval: exactly one of the two."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, use_attribute_docstrings=True
    )

    cron: Annotated[str, PlainValidator(_cron), WithJsonSchema(TEXT_SCHEMA)] | None = None
    """Five cron fields, matched against the wall clock of ``timezone``."""
    timezone: Annotated[str, PlainValidator(_zone), WithJsonSchema(TEXT_SCHEMA)] | None = None
    """An IANA time zone name for ``cron``; UTC when omitted."""
    interval: Duration | None = None
    """A fixed period such as ``15m``: ticks at its multiples since the epoch, in UTC."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_text(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _error(f"must be a mapping, not {data!r}", _SHAPE_HINT)
        return data

    @model_validator(mode="after")
    def _one_of(self) -> ScheduleConfig:
        if self.cron is None and self.interval is None:
            raise _error("sets neither cron nor interval", _SHAPE_HINT)
        if self.cron is not None and self.interval is not None:
            raise _error("sets both cron and interval", "keep one of them: " + _SHAPE_HINT)
        if self.interval is not None and self.timezone is not None:
            raise _error(
                "sets a timezone for an interval",
                "an interval counts from the epoch in UTC: remove `timezone:`, "
                "or use `cron:` for wall-clock times",
                at=("timezone",),
            )
        if self.interval is not None and self.interval < timedelta(seconds=1):
            raise _error(
                "is shorter than one second",
                "use an interval of at least 1s",
                at=("interval",),
            )
        return self

    def describe(self) -> str:
        """The schedule in one line: ``cron 0 3 * * * (Europe/Paris)`` or ``every 15m``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone or 'UTC'})"
        assert self.interval is not None
        return f"every {format_duration(self.interval)}"

    def latest(self, now: datetime) -> datetime:
        """The newest tick at or before ``now`` (an aware datetime), in UTC."""
        if self.interval is not None:
            return _EPOCH + (now - _EPOCH) // self.interval * self.interval
        # Ticks are those counted forwards (see _forward): start well before
        # ``now`` (a clock change moves wall time by at most two hours) at a
        # tick croniter counts backwards, and keep the last one not after ``now``.
        back = now.astimezone(self._tz()) - _DST_MARGIN
        while True:
            start = croniter(self.cron or "", back).get_prev(datetime)
            found = None
            for tick in self._forward(start - timedelta(minutes=1)):
                if tick > now:
                    break
                found = tick
            if found is not None:
                return found
            back = start

    def following(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (an aware datetime), in UTC."""
        if self.interval is not None:
            return self.latest(after) + self.interval
        return next(self._forward(after.astimezone(self._tz())))

    def _tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")

    def _forward(self, start: datetime) -> Iterator[datetime]:
        """The cron ticks after ``start`` (local), in UTC, oldest first.

        A wall time the clocks pass twice (they go back) is one tick, at its
        first occurrence: croniter's second one (``fold=1``) is left out. A
        wall time they skip (they go forward) is a tick at the end of the gap.
        """
        times = croniter(self.cron or "", start)
        while True:
            tick: datetime = times.get_next(datetime)
            if not tick.fold:
                yield tick.astimezone(UTC)
