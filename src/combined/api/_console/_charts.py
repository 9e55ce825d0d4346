"""Charts drawn on the server as inline SVG geometry: no chart library, no script.

A chart is numbers the template places in an ``<svg>``: bars (MAR per
month) or a line of points (a dataset's row count over time), with the
ticks of its value axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

WIDTH = 640
HEIGHT = 220
LEFT = 64  # room for the value axis' labels
RIGHT = 16
TOP = 12
BOTTOM = 32  # room for the time axis' labels


@dataclass(frozen=True, slots=True)
class Mark:
    """One bar or point: where it is drawn, and what it tells (its tooltip)."""

    x: float
    y: float
    width: float
    height: float
    label: str
    value: int
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    """What a template draws: marks, a polyline through them, and both axes' labels."""

    marks: list[Mark]
    y_ticks: list[tuple[float, str]]
    x_labels: list[tuple[float, str]] = field(default_factory=list)
    line: str = ""
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: float = HEIGHT - BOTTOM


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1 for 0)."""
    if value <= 1:
        return 1
    power = 10 ** int(math.floor(math.log10(value)))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return int(step * power)
    return int(10 * power)  # pragma: no cover - the loop always returns


def _y(value: int, top: int) -> float:
    return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / top)


def _ticks(top: int) -> list[tuple[float, str]]:
    return [(_y(v, top), f"{v:,}") for v in (0, top // 2, top)]


def bar_chart(items: Sequence[tuple[str, int]], unit: str) -> Chart:
    """One bar per ``(label, value)``, left to right."""
    top = nice_ceiling(max((v for _, v in items), default=0))
    span = WIDTH - LEFT - RIGHT
    slot = span / max(len(items), 1)
    width = min(slot * 0.7, 48)
    marks = []
    for i, (label, value) in enumerate(items):
        x = LEFT + slot * i + (slot - width) / 2
        y = _y(value, top)
        marks.append(
            Mark(x, y, width, HEIGHT - BOTTOM - y, label, value, f"{label}: {value:,} {unit}")
        )
    labels = [(m.x + m.width / 2, m.label) for m in marks]
    return Chart(marks, _ticks(top), labels)


def line_chart(points: Sequence[tuple[datetime, int]], unit: str) -> Chart:
    """A line through ``(instant, value)`` points, placed by time (oldest first)."""
    points = sorted(points)
    top = nice_ceiling(max((v for _, v in points), default=0))
    span = WIDTH - LEFT - RIGHT
    first = points[0][0] if points else None
    seconds = (points[-1][0] - points[0][0]).total_seconds() if points else 0.0
    marks = []
    for i, (at, value) in enumerate(points):
        if first is not None and seconds > 0:
            x = LEFT + span * (at - first).total_seconds() / seconds
        else:  # one instant (or one point): spread them evenly
            x = LEFT + span * ((i + 0.5) / len(points))
        label = at.strftime("%Y-%m-%d %H:%M:%S")
        title = f"{label} UTC: {value:,} {unit}"
        marks.append(Mark(x, _y(value, top), 0, 0, label, value, title))
    line = " ".join(f"{m.x:.1f},{m.y:.1f}" for m in marks)
    labels = [(m.x, m.label[:10]) for m in (marks[:1] + marks[-1:] if len(marks) > 1 else marks)]
    return Chart(marks, _ticks(top), labels, line)
