"""Checks before a Run: what the source shows a dataset cannot take is refused (exit 2).

A configuration problem found only inside a Run ends it ``failed``, which
reads as "retry later", and a retry meets it again. Where the source must be
asked (a column's type, a stream's replication key), the engine asks before
admitting the Run: a connector with a ``preflight(requests)`` method raises
:class:`~combined.errors.ConfigError` for what the datasets cannot take.
Anything else that goes wrong here (an unreachable server, a missing secret)
is left to the Run, which retries or classifies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from combined.config import Project
from combined.connectors.abc import CursorSpec, ReadRequest, Source
from combined.errors import CombinedError, ConfigError, SecretError


def requests_of(project: Project, source: str, datasets: Sequence[str]) -> list[ReadRequest]:
    """The declared reads of ``datasets`` (no checkpoint: what any read of them asks)."""
    out = []
    for name in datasets:
        d = project.dataset(source, name)
        cursor = d.cursor
        out.append(
            ReadRequest(
                dataset=name,
                relation=d.relation,
                key=tuple(d.key or ()),
                strategy=d.strategy,
                cursor=None
                if cursor is None
                else CursorSpec(cursor.column, cursor.lookback, cursor.trust, cursor.nulls),
                columns=tuple(d.columns) if d.columns else None,
            )
        )
    return out


def preflight(
    project: Project, source: str, datasets: Sequence[str], open_source: Callable[[str], Source]
) -> None:
    """Raise :class:`ConfigError` for what ``source`` says its ``datasets`` cannot take."""
    try:
        conn = open_source(source)
    except SecretError:
        return  # a secret that does not resolve: the Run says so
    check = getattr(conn, "preflight", None)
    try:
        if check is not None:
            check(requests_of(project, source, datasets))
    except ConfigError:
        raise
    except CombinedError:
        return  # unreachable, refused: the Run retries or classifies it
    finally:
        conn.close()
