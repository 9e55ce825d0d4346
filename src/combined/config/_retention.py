"""How long the lake keeps what it no longer serves: ``retention:``.

Declared at the project level and per dataset (a dataset's setting wins,
field by field)::

    retention:
      publications: 90d    # keep the files every publication of the last 90 days reads
      raw: 365d            # keep committed Deliveries (the raw layer) for a year
      compact_files: 32    # a capture compacts a table holding more small data files
      orphans: 7d          # remove files no commit names once they are 7 days old

Unset, everything is kept (``forever``): ``combined maintain`` then removes
only files no publication ever read, and no Delivery; it reports orphaned
files (those no commit names) and removes none. ``combined maintain``
applies it; see ``docs/maintenance.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from combined.config._values import _count, _duration, _error, format_duration

Forever = Literal["forever"]
FOREVER: Forever = "forever"
#: A capture compacts its table once it holds more small data files (under 1 MiB) than this.
DEFAULT_COMPACT_FILES = 32

_KEEP_HINT = "write a duration such as 90d or 52w, or `forever` to keep everything"


def _keep(value: object) -> timedelta | Forever:
    if value == FOREVER:
        return FOREVER
    try:
        return _duration(value)
    except Exception:  # noqa: BLE001 - said again with the retention's own hint
        raise _error(f"must be a duration or forever, not {value!r}", _KEEP_HINT) from None


def _format_keep(value: timedelta | Forever) -> str:
    return value if isinstance(value, str) else format_duration(value)


Keep = Annotated[
    timedelta | Forever,
    PlainValidator(_keep),
    PlainSerializer(_format_keep, return_type=str, when_used="json"),
]

#: The shortest ``orphans`` grace: a file younger than this may be one a writer
#: (a process of another catalog, one stalled past its lease) is about to commit.
MIN_ORPHAN_GRACE = timedelta(days=1)


def _grace(value: object) -> timedelta | Forever:
    kept = _keep(value)
    if not isinstance(kept, str) and kept < MIN_ORPHAN_GRACE:
        raise _error(
            f"must be at least {format_duration(MIN_ORPHAN_GRACE)} or forever, not {value!r}",
            "a younger file may be one a writer has not committed yet",
        )
    return kept


Grace = Annotated[
    timedelta | Forever,
    PlainValidator(_grace),
    PlainSerializer(_format_keep, return_type=str, when_used="json"),
]


def _threshold(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 2:
        raise _error(
            f"must be 2 or more, not {value!r}", "a table of fewer files has nothing to compact"
        )
    return _count(value)


class RetentionPolicy(BaseModel):
    """``retention:``: each field unset inherits (dataset from project, project from defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    publications: Keep | None = None
    """How long a publication's files stay readable (``--as-of``, ``--publication``)."""
    raw: Keep | None = None
    """How long a committed Delivery stays in the raw layer (``_deliveries/``)."""
    compact_files: Annotated[int, PlainValidator(_threshold)] | None = None
    """The count of small data files (under 1 MiB) past which a capture compacts its table."""
    orphans: Grace | None = None
    """How old a file no commit names must be before `combined maintain` removes it."""


@dataclass(frozen=True)
class Retention:
    """A dataset's effective retention, and where each part was declared."""

    publications: timedelta | Forever
    raw: timedelta | Forever
    compact_files: int
    #: The grace of files no commit names (``forever``: reported, never removed).
    orphans: timedelta | Forever
    #: For each field, the setting that gave it (``sources.shop.datasets.orders.retention``,
    #: ``retention``) or ``default``.
    declared_at: dict[str, str]

    def describe(self, field: str) -> str:
        """``retention.raw: 365d (sources.shop.datasets.orders.retention)``, for messages."""
        value = getattr(self, field)
        text = value if isinstance(value, str) else format_duration(value)
        return f"retention.{field}: {text} ({self.declared_at[field]})"


def effective(
    project: RetentionPolicy | None, dataset: RetentionPolicy | None, where: str
) -> Retention:
    """The retention of a dataset declared at ``where``, field by field."""
    defaults = {
        "publications": FOREVER,
        "raw": FOREVER,
        "compact_files": DEFAULT_COMPACT_FILES,
        "orphans": FOREVER,
    }
    values: dict[str, object] = {}
    declared: dict[str, str] = {}
    for name, default in defaults.items():
        for policy, at in ((dataset, f"{where}.retention"), (project, "retention")):
            if policy is not None and getattr(policy, name) is not None:
                values[name], declared[name] = getattr(policy, name), at
                break
        else:
            values[name], declared[name] = default, "default"
    return Retention(
        publications=values["publications"],  # type: ignore[arg-type]
        raw=values["raw"],  # type: ignore[arg-type]
        compact_files=int(values["compact_files"]),  # type: ignore[call-overload]
        orphans=values["orphans"],  # type: ignore[arg-type]
        declared_at=declared,
    )
