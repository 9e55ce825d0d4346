"""Columns an account reads through column grants alone, told by ``combined check``.

MariaDB and MySQL hide from an account every column it holds no privilege
on: ``information_schema.COLUMNS`` leaves it out, so a dataset without a
``columns:`` list reads the others and succeeds, the hidden columns missing
from the lake without a word. An account granted ``SELECT (a, b) ON t``
and nothing on the table itself sees ``a`` and ``b`` only; granted every
column so, it sees a column added later only once it is granted too. With
a privilege on the table itself (``INSERT``), every column shows, and one
it may not select fails the read (``needs_auth``).

So for each such dataset: ``SELECT * ... LIMIT 0`` (refused unless every
column may be read); the account's column grants on the table; and, when
it may read every column through them, ``SHOW CREATE TABLE`` (refused
without a privilege on the table itself). Each is a warning, not a
refusal: column grants may be deliberate, and the reads succeed.
"""

from __future__ import annotations

from collections.abc import Sequence

from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._connect import Session, quote_ident
from combined.errors import AuthRejected, NotFoundError

__all__ = ["column_grant_warnings"]


def column_grant_warnings(
    session: Session, requests: Sequence[ReadRequest], database: str
) -> list[str]:
    """A warning for each request without ``columns:`` whose relation the account reads
    through column grants alone, naming the columns it may not read when it sees them."""
    account = _account(session)
    out = []
    for r in requests:
        if r.columns is not None:
            continue  # (a listed column the account cannot see is refused by check)
        try:
            rel = catalog.find_relation(session, r.relation, database)
        except NotFoundError:
            continue  # (told by the dataset's own check)
        why = _hidden(session, rel, account)
        if why is not None:
            out.append(_told(r.dataset, rel, account, why))
    return out


def _account(session: Session) -> str:
    """The session's account as the privilege tables name it: ``'user'@'host'``."""
    ((current,),) = session.rows("SELECT CURRENT_USER()", "reading the account")
    user, _, host = str(current).rpartition("@")
    return f"'{user}'@'{host}'"


def _hidden(session: Session, rel: catalog.Relation, account: str) -> str | None:
    """What the account's column grants keep from a read of ``rel``; None when nothing."""
    table = _quoted(rel)
    granted = {
        str(name)
        for (name,) in session.rows(
            "SELECT COLUMN_NAME FROM information_schema.COLUMN_PRIVILEGES WHERE GRANTEE = "
            f"{session.literal(account)} AND TABLE_SCHEMA = {session.literal(rel.database)} "
            f"AND TABLE_NAME = {session.literal(rel.table)} AND PRIVILEGE_TYPE = 'SELECT'",
            "reading the account's column grants",
        )
    }
    if _allowed(session, f"SELECT * FROM {table} LIMIT 0"):
        if not granted or _allowed(session, f"SHOW CREATE TABLE {table}"):
            return None  # SELECT on the table, or a privilege on it that shows every column
        return (
            "it may read every column now, but a column added later stays hidden from it "
            "until granted, and captures leave it out without an error"
        )
    seen = catalog.columns(session, rel.database, [rel.table]).get(rel.table, [])
    denied = [c.name for c in seen if c.name not in granted]
    if denied:
        return (
            f"it may not read column(s) {', '.join(denied)}, which a capture selects and is refused"
        )
    return (
        "some columns are hidden from it (information_schema shows only those granted), so "
        "captures leave them out without an error"
    )


def _allowed(session: Session, query: str) -> bool:
    """Whether the account may run ``query`` (refused: a privilege it lacks)."""
    try:
        session.rows(query, "checking the account's privileges")
    except AuthRejected:
        return False
    return True


def _told(dataset: str, rel: catalog.Relation, account: str, why: str) -> str:
    table = _quoted(rel)
    return (
        f"dataset {dataset}: the account {account} reads {rel.database}.{rel.table} through "
        f"column grants, without SELECT on the table: {why}; GRANT SELECT ON {table} TO "
        f"{account} (as an administrator), or list the columns to read in `columns:`"
    )


def _quoted(rel: catalog.Relation) -> str:
    return f"{quote_ident(rel.database)}.{quote_ident(rel.table)}"
