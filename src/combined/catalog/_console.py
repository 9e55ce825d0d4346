"""Console sessions logged out: kept in the catalog, so every server process refuses them.

A session is known by the SHA-256 hex of its CSRF token (``api._console._session``);
a row lasts until the session's cookie would expire anyway.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _schema as t


def end_session(conn: Connection, session: str, until: datetime, now: datetime) -> None:
    """Record ``session`` as logged out until ``until``; forget those past ``now``."""
    logouts = t.console_logouts
    conn.execute(
        logouts.delete().where(sa.or_(logouts.c.until < now, logouts.c.session == session))
    )
    conn.execute(logouts.insert().values(session=session, until=until))


def session_ended(conn: Connection, session: str) -> bool:
    """Whether ``session`` was logged out (by any server on this catalog)."""
    logouts = t.console_logouts
    found = conn.execute(sa.select(logouts.c.session).where(logouts.c.session == session))
    return found.first() is not None
