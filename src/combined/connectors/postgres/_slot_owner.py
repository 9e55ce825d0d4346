"""Whose a replication slot is: another database's, another project's, or provably ours.

Slot names are the server's, a logical slot one database's. Two databases of
one server whose tables share a schema and a name, captured under one
``slot_prefix`` (two projects, or two sources of one project), compute one
slot name: the slot belongs to whichever database made it first, and the
other must never take it for its own leftover and drop it
(:func:`refuse_foreign_slot`).

Two projects capturing one table of one database under one ``slot_prefix``
compute one slot name too, in the same database. A first capture drops a
slot of its name that nothing streams from as the leftover of its own
interrupted stand-up: the other project's slot, idle between its captures,
looked just the same, and was dropped. So the publication, made before the
slot in the same name, carries its project's mark, ``COMMENT ON
PUBLICATION ... IS 'combined project <id>'`` (the id kept in the project's
lake: :class:`~combined.connectors.abc.StreamOwner`), written in the
transaction that creates it, so no crash leaves a publication of Combined's
unmarked. The role that creates a publication owns it, and its owner may
comment on it: no privilege beyond those a first capture needs. The mark
holds the id alone: every role of the server may read a comment
(``pg_description``), and the lake's location (a local lake's absolute path)
is none of theirs. An older mark, ``'combined project <id>, lake <lake>'``,
is read as the same project's, and rewritten without the lake when the
project next claims the publication (a first capture, ``combined cdc
setup``) and its role owns it.

:func:`judge` decides, under an advisory lock that two claimants of one
name take in turn (:func:`settle`):

- a publication marked by another project: its slot and publication are
  that project's, refused (never dropped, never streamed);
- marked by this project: its slot is this project's (an idle one the
  leftover of an interrupted first capture, dropped and made again); an
  older mark rewritten;
- no mark (made before Combined marked its publications, or by hand) and no
  slot: this project's from now on, marked when its role owns it;
- no mark, or no publication, and a slot: nothing on the server proves the
  slot is this project's leftover and not the live slot of another project
  that made its publication before the marks existed (or that, like this
  one, captures through a publication a DBA made, which its role may not
  mark). It is this project's when its lake records that it made this very
  slot (:func:`record_made`, below), or holds a checkpoint of the dataset
  (``resumed``: the project streamed from it before); otherwise it is
  refused, saying how to drop it by hand when it is this project's.

**The lake's record of a slot made.** Right after a first capture makes its
slot, before it reads the snapshot, it keeps in its project's lake
(``abc.StreamRecords``) the slot's name, database and consistent point
(``confirmed_flush_lsn`` as made) with the project's id. A slot of that name
and database whose ``confirmed_flush_lsn`` is still that point is the one
this project made and nothing streamed from since: an interrupted first
capture's leftover, dropped and made again by the retry. Every slot made
writes WAL before its consistent point, so no slot made later, by anyone,
has the same point; one that streamed has moved on. The record is not
cleared when the capture commits: it names that one slot, which its
project's later captures then resume from, and the next slot made under the
name replaces it. A record is written only once the slot exists (a record
written before would prove nothing: another claimant may make the slot
first); a capture killed between the two leaves a slot that is refused,
as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from combined.connectors.abc import StreamOwner
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.errors import ConfigError, SourceError

__all__ = [
    "DROP_SQL",
    "Claim",
    "mark_of",
    "marked_by_another",
    "record_made",
    "refuse_changed",
    "refuse_foreign_slot",
    "refuse_unowned",
    "settle",
    "stamp",
]

#: A publication's comment that marks it a Combined project's: what :func:`mark_of` writes,
#: or what it wrote before (the project's lake after the id).
_MARK = re.compile(r"combined project ([0-9a-f]{32})(?:, lake (.*))?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Claim:
    """Who asks for a stream's slot and publication, and on what evidence.

    ``owner`` is None for a source the engine named no project for: it marks
    nothing and can prove nothing its own. ``resumed``: the lake holds a
    checkpoint of the dataset, so the project streamed from the slot before.
    """

    owner: StreamOwner | None
    resumed: bool = False


def mark_of(owner: StreamOwner) -> str:
    """The comment that marks a publication ``owner``'s: its id, nothing of its lake."""
    return f"combined project {owner.id}"


def marked_by_another(comment: str | None, owner: StreamOwner | None) -> bool:
    """Whether a publication's ``comment`` marks it a project other than ``owner``."""
    marked = _MARK.fullmatch(comment or "")
    return marked is not None and (owner is None or marked.group(1) != owner.id)


def settle(conn: psycopg.Connection[Any], name: str, claim: Claim) -> str | None:
    """Take publication ``name``'s claim lock (held until ``conn``'s transaction ends),
    then :func:`judge` it: refuse it, or mark it the claimant's when it has no mark and
    the role owns it. A publication made after this in the transaction is :func:`stamp`-ed.
    Returns the slot of the name as judged: its ``confirmed_flush_lsn`` ('' when unset),
    None when there was none (what :data:`DROP_SQL` drops: that very slot alone).
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"combined:{name}",))
    seen = _read(conn, name)
    mark = judge(name, claim, **seen.judged(name, claim))
    if mark and seen.owns and claim.owner is not None:
        stamp(conn, name, claim.owner)
    return seen.flushed


def refuse_unowned(conn: psycopg.Connection[Any], name: str, claim: Claim) -> str | None:
    """Raise what :func:`refuse_foreign_slot`, then :func:`judge`, raise of publication
    ``name`` and its slot; mark nothing. Returns the slot as judged (see :func:`settle`)."""
    refuse_foreign_slot(conn, name)
    seen = _read(conn, name)
    judge(name, claim, **seen.judged(name, claim))
    return seen.flushed


#: Drops slot ``%s`` when ``%s`` is true, else only while its ``confirmed_flush_lsn``
#: is still ``%s`` ('' for none), as judged: one statement, so no slot made again, or
#: streamed from, after the judgement is dropped on its strength. Every slot made writes
#: WAL before its consistent point: no slot made later has the point of one made before.
DROP_SQL = (
    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
    "WHERE slot_name = %s AND (%s OR confirmed_flush_lsn IS NOT DISTINCT FROM "
    "NULLIF(%s, '')::pg_lsn)"
)


def refuse_changed(conn: psycopg.Connection[Any], slot: str) -> None:
    """Raise :class:`SourceError` when slot ``slot`` exists: :data:`DROP_SQL` left it,
    changed since it was judged (streamed from, or dropped and made again)."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is not None:
        raise SourceError(
            f"replication slot {slot!r} changed since it was judged this project's (its "
            f"confirmed position is now {row[0] or 'unset'}: streamed from, or dropped and "
            "made again by another): left alone",
            hint="run the command again: it judges the slot afresh, and refuses it "
            "when nothing proves it this project's",
            slot=slot,
        )


@dataclass(frozen=True, slots=True)
class _Seen:
    """Publication ``name`` and its slot as the server shows them (:func:`_read`)."""

    published: bool
    comment: str | None
    owns: bool  # (this role may comment on the publication)
    database: str
    flushed: str | None  # (the slot's confirmed_flush_lsn; None: no slot in this database)

    def judged(self, name: str, claim: Claim) -> dict[str, Any]:
        """What :func:`judge` takes of this."""
        slotted = self.flushed is not None
        return {
            "published": self.published,
            "comment": self.comment,
            "database": self.database,
            "slotted": slotted,
            "made": slotted
            and not claim.resumed
            and _made_here(claim, name, self.database, self.flushed),
        }


def _read(conn: psycopg.Connection[Any], name: str) -> _Seen:
    """Publication ``name`` and the slot of the name in this database (one of another
    is :func:`refuse_foreign_slot`'s)."""
    row = conn.execute(
        "SELECT p.oid IS NOT NULL, obj_description(p.oid, 'pg_publication'), "
        "coalesce(pg_has_role(p.pubowner, 'USAGE'), false), current_database()::text, "
        "(SELECT coalesce(s.confirmed_flush_lsn::text, '') FROM pg_replication_slots s "
        "WHERE s.slot_name = %(name)s AND s.database = current_database()) "
        "FROM (SELECT 1) one LEFT JOIN pg_publication p ON p.pubname = %(name)s",
        {"name": name},
    ).fetchone()
    assert row is not None
    return _Seen(bool(row[0]), row[1], bool(row[2]), row[3], row[4])


def judge(
    name: str,
    claim: Claim,
    *,
    published: bool,
    comment: str | None,
    slotted: bool,
    made: bool = False,
    database: str | None = None,
) -> bool:
    """Whether publication ``name`` is to be marked the claimant's now (it has no mark, or
    the claimant's older one naming its lake); raise :class:`ConfigError` when it and its
    slot are another project's, or when its slot is not provably the claimant's (see the
    module). ``made``: the claimant's lake records that it made this very slot
    (:func:`record_made`); ``database``: the one the publication is in (named)."""
    marked = _MARK.fullmatch(comment or "")
    if marked is not None:
        if claim.owner is None or marked_by_another(comment, claim.owner):
            raise _foreign(name, marked.group(1), marked.group(2), claim.owner, database)
        return comment != mark_of(claim.owner)
    if slotted and not (claim.resumed or made):
        raise _unproven(name, claim, published)
    return claim.owner is not None and published and comment is None


def record_made(owner: StreamOwner | None, slot: str, database: str, consistent: str) -> None:
    """Keep in ``owner``'s lake that it made slot ``slot`` of ``database``, whose
    consistent point (``confirmed_flush_lsn`` as made) is ``consistent``; nothing
    when no lake keeps records for it (nothing is proved its own then)."""
    if owner is not None and owner.records is not None:
        owner.records.keep(slot, _made(owner, slot, database, consistent))


def _made(owner: StreamOwner, slot: str, database: str, consistent: str) -> dict[str, str]:
    return {"project": owner.id, "slot": slot, "database": database, "consistent": consistent}


def _made_here(claim: Claim, slot: str, database: str, flushed: str | None) -> bool:
    """Whether the claimant's lake records that it made slot ``slot`` of ``database``
    and nothing streamed from it since (its ``confirmed_flush_lsn`` still ``flushed``)."""
    owner = claim.owner
    if owner is None or owner.records is None or not flushed:
        return False
    kept: Mapping[str, str] = owner.records.kept(slot) or {}
    consistent = kept.get("consistent", "")
    return (
        bool(consistent)
        and kept == _made(owner, slot, database, consistent)
        and text_to_lsn(consistent) == text_to_lsn(flushed)
    )


def stamp(conn: psycopg.Connection[Any], name: str, owner: StreamOwner) -> None:
    """Mark publication ``name`` ``owner``'s (its role must own it)."""
    conn.execute(
        sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
            sql.Identifier(name), sql.Literal(mark_of(owner))
        )
    )


def _foreign(
    name: str, other: str, lake: str | None, owner: StreamOwner | None, database: str | None
) -> ConfigError:
    """The refusal of publication ``name`` of ``database`` marked by project ``other``
    (and, in an older mark, its ``lake``), not the claimant ``owner``."""
    where = f", lake {lake}" if lake else ""
    this_database = "this database" + (f" ({database!r})" if database else "")
    # A lake wiped or replaced makes a new id: the project's own publication then
    # reads as another's, and only a person can tell.
    this = "this one has no id yet" if owner is None else f"this one is project {owner.id}"
    drop = (
        f"SELECT pg_drop_replication_slot('{name}') FROM pg_replication_slots "
        f"WHERE slot_name = '{name}'; DROP PUBLICATION {name};"
    )
    return ConfigError(
        f"replication slot and publication {name!r} belong to another Combined project "
        f"(project {other}{where}), which captures the same table from {this_database} "
        "under the same slot_prefix",
        hint="set a distinct `slot_prefix` for this source in combined.yaml (its slots and "
        "publications then take other names); the other project's are left alone. If this "
        "project made them before its lake was wiped or replaced (a new lake is a new project "
        f"id: {this}), they are its own leftovers, streamed to a lake that is gone: drop "
        f"them, then capture again: {drop} Do the same if that other project is gone (its "
        "lake deleted)",
        slot=name,
        project=other,
        **({"database": database} if database else {}),
    )


def _unproven(name: str, claim: Claim, published: bool) -> ConfigError:
    had = "carries no Combined project's mark" if published else "does not exist"
    mark = (
        ""
        if claim.owner is None or not published
        else " (or, as the publication's owner, mark it this project's, which keeps the "
        f"slot: COMMENT ON PUBLICATION {name} IS {_quoted(mark_of(claim.owner))})"
    )
    return ConfigError(
        f"replication slot {name!r} exists and its publication {had}, and the lake holds no "
        "checkpoint of the dataset: nothing proves the slot is this project's leftover of an "
        "interrupted first capture and not the slot another Combined project streams from "
        "(a publication made before Combined marked its own, or by hand)",
        hint="if no other project captures this table from this database under this "
        f"slot_prefix, drop the slot and capture again: SELECT pg_drop_replication_slot('{name}')"
        f"{mark}; otherwise set a distinct `slot_prefix` for this source, and mark nothing: "
        "the slot is the other project's",
        slot=name,
    )


def _quoted(text: str) -> str:
    """``text`` as an SQL string literal (for a statement a person runs)."""
    return "'" + text.replace("'", "''") + "'"


def refuse_foreign_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Raise :class:`ConfigError` when slot ``slot`` exists, made in another database."""
    row = conn.execute(
        "SELECT database::text, current_database()::text FROM pg_replication_slots "
        "WHERE slot_name = %s AND database IS DISTINCT FROM current_database()",
        (slot,),
    ).fetchone()
    if row is not None:
        owner = "no database (physical)" if row[0] is None else f"database {row[0]!r}"
        raise ConfigError(
            f"replication slot {slot!r} belongs to {owner}, not to {row[1]!r} that the source's "
            "dsn names: slot names are shared by the server's databases (a capture there of a "
            "table of the same schema and name under the same slot_prefix takes this one)",
            hint="give this source a distinct `slot_prefix` (its slots and publications take "
            "other names); the slot is left to its database",
            slot=slot,
        )
