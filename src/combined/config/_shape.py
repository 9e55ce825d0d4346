"""The shape rules of one dataset: which settings need, exclude or leave out which others.

Each function returns the problems of one group of settings, in the order
:meth:`~combined.config._models.DatasetConfig._check_shape` reports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from combined.config._secrets import Problem

if TYPE_CHECKING:
    from combined.config._models import DatasetConfig


def key_problems(dataset: DatasetConfig) -> list[Problem]:
    """History and key against the sync mode."""
    problems: list[Problem] = []
    if dataset.history and dataset.sync_mode == "append":
        problems.append(
            (
                ("history",),
                "keeps versions of keyed rows, and sync_mode append keeps every event already",
                "remove `history: true`, or use `sync_mode: incremental`",
            )
        )
    if dataset.key is None and dataset.sync_mode != "append":
        problems.append(
            (
                ("key",),
                f"is required when sync_mode is {dataset.sync_mode}",
                "add `key: [<column>]` naming the columns that identify a row, "
                "`key: []` for a table without one (each row identified by its content), "
                "or set `sync_mode: append`",
            )
        )
    if dataset.key == [] and dataset.sync_mode != "append":
        problems.extend(_keyless_problems(dataset))
    if not dataset.key and dataset.sync_mode == "append" and dataset.strategy == "cdc":
        # The first capture's snapshot and the stream overlap: only the key
        # tells a row read in both apart from two events.
        problems.append(
            (
                ("key",),
                "is required when strategy is cdc, with sync_mode append too",
                "declare `key:` with the table's replica identity columns (a table "
                "without a primary key: REPLICA IDENTITY FULL, and key every column), "
                "or use `strategy: snapshot`",
            )
        )
    return problems


def _keyless_problems(dataset: DatasetConfig) -> list[Problem]:
    """``key: []`` (rows identified by their content) against what needs a key."""
    problems: list[Problem] = []
    if dataset.strategy != "snapshot":
        # A cursor pages by its key; a change stream matches deletes and
        # updates by it: neither can find a row by its old content.
        problems.append(
            (
                ("key",),
                f"is [] (rows identified by their content), which needs strategy snapshot, "
                f"not {dataset.strategy}",
                "use `strategy: snapshot` (the table read whole), or declare the key columns",
            )
        )
    if dataset.history:
        problems.append(
            (
                ("history",),
                "keeps versions of keyed rows: without a key a changed row is a new row",
                "remove `history: true`, or declare the key columns",
            )
        )
    if dataset.deletes is not None:
        problems.append(
            (
                ("deletes",),
                "deletes the key of a flagged row: key [] has none",
                "remove `deletes:` (a snapshot without the row deletes it), or declare the key",
            )
        )
    return problems


def cursor_problems(dataset: DatasetConfig) -> list[Problem]:
    """The cursor against the strategy and the sync mode."""
    problems: list[Problem] = []
    if dataset.strategy == "cursor" and dataset.cursor is None:
        problems.append(
            (
                ("cursor",),
                "is required when strategy is cursor",
                'add `cursor: {column: <column>, trust: "<why it only grows>"}`',
            )
        )
    if dataset.strategy != "cursor" and dataset.cursor is not None:
        problems.append(
            (
                ("cursor",),
                f"is only used by strategy cursor, not {dataset.strategy}",
                "remove `cursor:` or set `strategy: cursor`",
            )
        )
    if dataset.sync_mode == "append" and dataset.cursor is not None and dataset.cursor.lookback:
        # The window is read again every run: the key makes that harmless
        # in a keyed merge, an append stream would keep each row once more.
        problems.append(
            (
                ("cursor", "lookback"),
                "re-reads rows every run, which sync_mode append would keep twice",
                "use `sync_mode: incremental` (its key merges the re-read rows), or `lookback: 0`",
            )
        )
    if (
        dataset.sync_mode == "append"
        and dataset.cursor is not None
        and dataset.cursor.nulls == "include"
    ):
        # Rows with a NULL cursor are read every run: an append stream
        # would keep each of them once more per capture.
        problems.append(
            (
                ("cursor", "nulls"),
                "re-reads rows every run, which sync_mode append would keep again each time",
                "use `sync_mode: incremental` (its key merges the re-read rows), "
                "or `nulls: exclude`",
            )
        )
    return problems


def mode_problems(dataset: DatasetConfig) -> list[Problem]:
    """Full refresh and soft deletes against the strategy and the sync mode."""
    problems: list[Problem] = []
    if dataset.sync_mode == "full_refresh" and dataset.strategy != "snapshot":
        # A cursor or a change stream reads only what changed: replacing the
        # projection with it would drop every row it did not read.
        problems.append(
            (
                ("sync_mode",),
                f"is full_refresh, which needs strategy snapshot, not {dataset.strategy}",
                "use `strategy: snapshot`, or sync_mode incremental or append",
            )
        )
    if dataset.deletes is not None and dataset.sync_mode != "incremental":
        # A delete removes a key from a merged projection: an event stream
        # has no key to remove, a replacement none to keep apart.
        problems.append(
            (
                ("deletes",),
                f"needs sync_mode incremental, not {dataset.sync_mode}: "
                + (
                    "an event stream keeps every row it reads, with no key to delete"
                    if dataset.sync_mode == "append"
                    else "a delete removes its key from a merged projection"
                ),
                "set `sync_mode: incremental` with a `key:` (a snapshot's flagged rows "
                "then leave the projection), or remove `deletes:` to keep flagged rows "
                "as they are",
            )
        )
    return problems


def column_problems(dataset: DatasetConfig) -> list[Problem]:
    """A column list that leaves out a column the key, cursor or flag needs."""
    problems: list[Problem] = []
    if dataset.columns is not None:
        needed = list(dataset.key or [])
        if dataset.cursor is not None:
            needed.append(dataset.cursor.column)
        if dataset.deletes is not None:
            needed.append(dataset.deletes.flag)
        for column in dict.fromkeys(needed):
            if column not in dataset.columns:
                problems.append(
                    (
                        ("columns",),
                        f"leaves out {column!r}, which the key, cursor or soft-delete flag needs",
                        f"add {column} to columns",
                    )
                )
    return problems
