"""What binlog change capture needs from the server, and where a stream stands.

:func:`preconditions` lists every unmet requirement with the exact fix;
:func:`require_binlog` raises them as one error before any read, and
``combined check`` reports them for a source with ``cdc`` datasets. The
requirements:

- ``log_bin`` on: the server writes a binary log at all;
- ``binlog_format=ROW``: statements would have to be re-executed to know
  which rows they changed;
- ``binlog_row_image=FULL``: an update or delete must carry the whole row,
  so the lake can be written without reading the source again;
- ``binlog_row_metadata=FULL``: the log names each column, so a change
  logged before a later ``ALTER TABLE`` is read with its own columns;
- ``server_id`` not 0: the server streams its log only then;
- ``log_slave_updates`` on in a replica (MariaDB's default is off): else the
  changes it applies from its primary are in its tables, not in its log;
- ``log_bin_compress`` off (MariaDB): the reader cannot decode compressed
  events, and a change it cannot decode must fail the read, not be skipped
  (``_binlog.py`` fails on a compressed rows event of the table it meets;
  another table's it skips, and a compressed statement it decompresses);
- the account holds ``REPLICATION SLAVE`` (stream the log) and
  ``REPLICATION CLIENT`` (``SHOW BINARY LOGS``; ``BINLOG MONITOR`` on
  MariaDB 10.5 and later, which ``REPLICATION CLIENT`` grants), and on MySQL
  ``LOCK TABLES`` (``_binlog_anchor``).

A position is ``file:offset`` text (``binlog.000042:1337``): the end of the
last transaction the lake holds. :func:`require_retained` refuses one whose
file the server no longer has (purged by ``binlog_expire_logs_seconds`` or
by hand): the changes in between are gone, never silently skipped. A capture
and ``combined check`` refuse it (``_binlog_origin.require_resumable``), and
``cdc status`` tells it (``committed_retained``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from combined.connectors.mariadb._connect import Session
from combined.errors import (
    CombinedError,
    ConfigError,
    NeedsSnapshot,
    ProtocolViolation,
    SourceError,
)

#: The command pair that takes a new snapshot after a gap.
RESNAPSHOT = (
    "run `combined cdc teardown <source>` then `combined cdc setup <source>`: the checkpoint "
    "is voided and a new consistent snapshot is reconciled with the lake"
)
_CONFIG = "in the [mariadbd] (MySQL: [mysqld]) section of the server's configuration file"


class GrantsMissing(ConfigError):
    """The account lacks a replication privilege: told by ``check`` as a configuration
    error (exit 2), it ends a Run ``needs_auth`` (an administrator must grant it)."""

    run_state = "needs_auth"


class BinlogGone(NeedsSnapshot):
    """The server no longer holds the binlog position the lake's checkpoint names (or holds
    another log under its name).

    No retry can succeed: a person takes a new snapshot (``needs_review``).
    """


@dataclass(frozen=True, slots=True)
class Problem:
    """One unmet requirement and the exact fix (``grant``: a privilege the account lacks)."""

    what: str
    fix: str
    grant: bool = False


def parse_position(text: str) -> tuple[str, int]:
    """``binlog.000042:1337`` as (file, offset)."""
    name, sep, offset = str(text).rpartition(":")
    if not sep or not name or not offset.isdigit():
        raise ProtocolViolation(
            f"a binlog checkpoint names no position: {text!r}",
            hint="expected `file:offset`, such as binlog.000042:1337",
        )
    return name, int(offset)


def position_of(state: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """The position of a committed cdc checkpoint (``None`` before the first)."""
    if not state or not state.get("binlog"):
        return None
    return parse_position(str(state["binlog"]))


def acknowledged(state: Mapping[str, Any]) -> None:
    """Check an acknowledged state; nothing is confirmed to the server.

    Nothing on the server remembers a binlog consumer: the position lives in
    the lake's checkpoint only, durable once the commit holding it is.
    """
    if position_of(state) is None:
        raise ProtocolViolation(
            f"not a checkpoint state of this extraction: {dict(state)!r}",
            hint="acknowledge the state of a StateMessage this extraction yielded",
        )


def _variables(session: Session) -> dict[str, str]:
    rows = session.rows(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', "
        "'binlog_row_image', 'binlog_row_metadata', 'server_id', 'expire_logs_days', "
        "'binlog_expire_logs_seconds', 'gtid_mode', 'version', 'version_comment', "
        "'log_bin_compress', 'log_slave_updates', 'log_replica_updates')",
        "reading the binary log settings",
    )
    return {str(k).lower(): str(v) for k, v in rows}


def preconditions(session: Session, user: str) -> list[Problem]:
    """Every unmet requirement of binlog capture, each with its fix."""
    v = _variables(session)
    out: list[Problem] = []
    if v.get("log_bin", "OFF").upper() not in ("ON", "1"):
        out.append(
            Problem(
                "the binary log is off (log_bin=OFF)",
                f"add log_bin=mysql-bin {_CONFIG} and restart the server",
            )
        )
    fmt = v.get("binlog_format", "").upper()
    if fmt != "ROW":
        out.append(
            Problem(
                f"binlog_format is {fmt or 'unset'}, not ROW",
                f"SET GLOBAL binlog_format = 'ROW' and add binlog_format=ROW {_CONFIG}",
            )
        )
    image = v.get("binlog_row_image", "FULL").upper()
    if image != "FULL":
        out.append(
            Problem(
                f"binlog_row_image is {image}, not FULL: updates and deletes would carry "
                "only part of the row",
                f"SET GLOBAL binlog_row_image = 'FULL' and add binlog_row_image=FULL {_CONFIG}",
            )
        )
    meta = v.get("binlog_row_metadata")
    if meta is None:
        out.append(
            Problem(
                "the server has no binlog_row_metadata: it logs no column names",
                "upgrade to MariaDB 10.5 or MySQL 8.0.14 or later",
            )
        )
    elif meta.upper() != "FULL":
        out.append(
            Problem(
                f"binlog_row_metadata is {meta}, not FULL: the log names no columns",
                f"SET GLOBAL binlog_row_metadata = 'FULL' and add binlog_row_metadata=FULL "
                f"{_CONFIG}",
            )
        )
    out.extend(_server_problems(v))
    out.extend(_replica_problems(session, v))
    mariadb = "mariadb" in (v.get("version", "") + v.get("version_comment", "")).lower()
    out.extend(_grant_problems(session, user, mariadb=mariadb))
    return out


def _server_problems(v: Mapping[str, str]) -> list[Problem]:
    """What the server's identity and its log's encoding keep from streaming it."""
    out: list[Problem] = []
    if v.get("server_id", "0") == "0":
        out.append(
            Problem(
                "server_id is 0: the server streams no binary log",
                f"SET GLOBAL server_id = 1 (any value other replicas do not use) and add "
                f"server_id=1 {_CONFIG}",
            )
        )
    if v.get("log_bin_compress", "OFF").upper() in ("ON", "1"):
        out.append(
            Problem(
                "log_bin_compress is ON: the server compresses its binary log's events, which "
                "the binlog reader cannot decode",
                f"SET GLOBAL log_bin_compress = OFF and add log_bin_compress=OFF {_CONFIG}; "
                "changes logged compressed since the last capture cannot be read: then "
                + RESNAPSHOT,
            )
        )
    return out


def _replica_problems(session: Session, v: Mapping[str, str]) -> list[Problem]:
    """A replica that does not log what it applies (MariaDB's default): its binary log holds
    none of its primary's changes, though its tables (and so the first snapshot) do."""
    logs = v.get("log_slave_updates", v.get("log_replica_updates", "ON")).upper()
    if logs in ("ON", "1") or not _replicates(session):
        return []
    return [
        Problem(
            "the server is a replica with log_slave_updates=OFF: the changes it applies from "
            "its primary are not written to its binary log, so a capture would see none of "
            "them",
            f"add log_slave_updates=ON (MySQL: log_replica_updates=ON) {_CONFIG} and restart "
            "the server, or capture from the primary; changes applied before were never "
            f"logged: then {RESNAPSHOT}",
        )
    ]


def _replicates(session: Session) -> bool:
    """Whether the server is configured as a replica (else, without the grant to ask,
    whether a replica thread runs)."""
    for query in ("SHOW ALL SLAVES STATUS", "SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
        try:  # MariaDB; MySQL 8.0.22 and later; older MySQL
            return bool(session.rows(query, "reading the server's replication"))
        except CombinedError:
            continue
    rows = session.rows("SHOW GLOBAL STATUS LIKE 'Slaves_running'", "reading the replicas")
    return bool(rows) and str(rows[0][1]) not in ("", "0")


def _grant_problems(session: Session, user: str, *, mariadb: bool) -> list[Problem]:
    grants = " ".join(
        str(r[0]).upper() for r in session.rows("SHOW GRANTS", "reading the account's grants")
    )
    everything = "GRANT ALL PRIVILEGES ON *.*" in grants
    missing = []
    if not everything and not any(
        r in grants for r in ("REPLICATION SLAVE", "REPLICATION REPLICA")
    ):
        missing.append("REPLICATION SLAVE")
    client = ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")
    if not everything and not any(c in grants for c in client):
        missing.append("REPLICATION CLIENT")
    # MySQL pins no binlog position to a snapshot: a brief LOCK TABLES anchors it.
    if not mariadb and not everything and "LOCK TABLES" not in grants:
        missing.append("LOCK TABLES")
    if not missing:
        return []
    return [
        Problem(
            f"the account {user!r} lacks {' and '.join(missing)}",
            f"GRANT {', '.join(missing)} ON *.* TO '{user}'@'<host>' (as an administrator)",
            grant=True,
        )
    ]


def require_binlog(session: Session, relation: str) -> None:
    """Raise one error naming every unmet requirement and its fix."""
    problems = preconditions(session, session.settings.user)
    if problems:
        # A grant alone missing: the Run needs credentials (needs_auth), as a table's
        # SELECT missing does; a retry could not succeed before an administrator acts.
        error = GrantsMissing if all(p.grant for p in problems) else ConfigError
        raise error(
            f"change capture of {relation} from the binary log cannot start: "
            + "; ".join(p.what for p in problems),
            hint="; ".join(p.fix for p in problems),
            relation=relation,
        )


def require_logged_table(session: Session, database: str, table: str) -> None:
    """Refuse a relation whose binlog does not say which rows changed.

    A view has no row events at all: its base tables' changes are logged
    under their own names, so the stream found none and every capture after
    the first snapshot succeeded with nothing. MariaDB logs a ``DELETE`` of a
    system-versioned table as an update that closes the row's period, and an
    ``UPDATE`` as the current row's update followed by the insert of its
    history row, both under the same key. A foreign key's cascading action
    is done by InnoDB below the binlog: the child rows it deletes or changes
    have no row event (:func:`_refuse_cascades`). A server filtering its log
    by database leaves changes out (:func:`_refuse_binlog_filters`).
    """
    rows = session.rows(
        "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
        f"{session.literal(database)} AND TABLE_NAME = {session.literal(table)}",
        "reading the table's type",
    )
    kind = str(rows[0][0]).upper() if rows else ""
    if kind == "VIEW":
        raise ConfigError(
            f"{database}.{table} is a view: the binary log records the changes of its base "
            "tables under their own names, never the view's, so a change capture would read "
            "the first snapshot and then no change at all",
            hint="capture the view with the snapshot or cursor strategy, or capture its base "
            "table with cdc",
            relation=f"{database}.{table}",
        )
    if kind == "SYSTEM VERSIONED":
        raise ConfigError(
            f"table {database}.{table} is system-versioned: its binary log records a deleted "
            "row as an update that ends its period and an update as an update plus the insert "
            "of a history row, so a change capture would keep deleted rows and old values",
            hint="capture the table with the snapshot or cursor strategy, or capture a table "
            "without system versioning (ALTER TABLE ... DROP SYSTEM VERSIONING drops its "
            "history)",
            relation=f"{database}.{table}",
        )
    _refuse_cascades(session, database, table)
    _refuse_binlog_filters(session, database)


def require_snapshot_engine(session: Session, database: str, table: str) -> None:
    """Refuse a first snapshot of a table whose engine no consistent snapshot covers.

    The stitched first capture ties the snapshot to the binlog position
    MariaDB pins to it, and only a transactional engine (InnoDB) is read in
    that snapshot: a MyISAM, Aria or MEMORY table is read as it changes, so
    no position can be tied to what was read. Before, ``combined check`` and
    ``cdc setup`` passed such a table and the first capture read it whole
    and then failed, taking the Run's other datasets with it.
    """
    from combined.connectors.mariadb._catalog import TRANSACTIONAL_ENGINES

    rows = session.rows(
        "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
        f"{session.literal(database)} AND TABLE_NAME = {session.literal(table)}",
        "reading the table's engine",
    )
    engine = str(rows[0][0] or "") if rows else ""
    if rows and engine not in TRANSACTIONAL_ENGINES:
        raise ConfigError(
            f"table {database}.{table} uses the {engine or 'unknown'} engine, which is not "
            "transactional: no consistent snapshot covers it, so the first capture cannot "
            "tie a binlog position to the rows it reads",
            hint=f"ALTER TABLE {database}.{table} ENGINE=InnoDB, or capture the table with the "
            "snapshot or cursor strategy",
            relation=f"{database}.{table}",
        )


def binlog_status(session: Session) -> list[tuple[Any, ...]]:
    """The server's ``SHOW BINARY LOG STATUS`` (``SHOW MASTER STATUS`` before MySQL 8.2
    and on MariaDB): file, position, ``Binlog_Do_DB``, ``Binlog_Ignore_DB``, ..."""
    try:  # MySQL 8.2 and later; MySQL 8.4 has no SHOW MASTER STATUS
        return session.rows("SHOW BINARY LOG STATUS", "reading the binlog status")
    except SourceError:
        return session.rows("SHOW MASTER STATUS", "reading the binlog status")


def _refuse_binlog_filters(session: Session, database: str) -> None:
    """Refuse a server that filters its binary log by database (``binlog_do_db``,
    ``binlog_ignore_db``).

    A filter that leaves the captured database out logs none of its rows. One
    that keeps it still judges a statement by the session's default database,
    not by the table's: ``TRUNCATE shop.t`` or an ``ALTER TABLE`` run with
    another database (or none) as the default is not logged (tested on
    MariaDB 10.11), and the lake kept rows the source had lost. Either went
    by silently: the capture succeeded with no change.
    """
    rows = binlog_status(session)
    if not rows or len(rows[0]) < 4:
        return
    do = [d for d in str(rows[0][2] or "").split(",") if d]
    ignore = [d for d in str(rows[0][3] or "").split(",") if d]
    if not do and not ignore:
        return
    shown = f"binlog_do_db={','.join(do)}" if do else f"binlog_ignore_db={','.join(ignore)}"
    if (do and database not in do) or database in ignore:
        why = f"leaves database {database} out: none of its changes is logged"
    else:
        why = (
            f"judges a statement by the session's default database, not the table's: a "
            f"TRUNCATE or ALTER TABLE of {database} run while another database (or none) is "
            "the default is not logged, and the lake would keep rows the source no longer has"
        )
    raise ConfigError(
        f"the server filters its binary log by database ({shown}), which {why}",
        hint="remove every binlog_do_db and binlog_ignore_db line "
        f"{_CONFIG} and restart the server (filter on a replica with replicate_do_db "
        "instead); changes of the table made while the filter was on were never logged: "
        f"then {RESNAPSHOT}",
        database=database,
    )


_CASCADING = "('CASCADE', 'SET NULL', 'SET DEFAULT')"


def _refuse_cascades(session: Session, database: str, table: str) -> None:
    """Refuse a table a foreign key changes by cascade: those changes are not logged.

    A parent's delete or key update reached the child through ``ON DELETE
    CASCADE`` (or ``SET NULL``, ``ON UPDATE CASCADE``) with no row event, and
    the lake kept the child rows the source no longer held.
    """
    rows = session.rows(
        "SELECT CONSTRAINT_NAME, REFERENCED_TABLE_NAME, DELETE_RULE, UPDATE_RULE "
        "FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = "
        f"{session.literal(database)} AND TABLE_NAME = {session.literal(table)} AND "
        f"(DELETE_RULE IN {_CASCADING} OR UPDATE_RULE IN {_CASCADING}) ORDER BY CONSTRAINT_NAME",
        "reading the table's foreign keys",
    )
    if rows:
        name, parent, on_delete, on_update = (str(v) for v in rows[0])
        raise ConfigError(
            f"table {database}.{table} has foreign key {name} to {parent} with ON DELETE "
            f"{on_delete} ON UPDATE {on_update}: the server applies such a cascade without "
            "logging its rows, so a change capture would keep the child rows it deleted or "
            "changed",
            hint="capture the table with the snapshot or cursor strategy, or make the foreign "
            "key ON DELETE RESTRICT ON UPDATE RESTRICT (the application changes the child rows "
            "itself, and they are logged)",
            relation=f"{database}.{table}",
            constraint=name,
        )


def binary_logs(session: Session) -> list[tuple[str, int]]:
    """The binlog files the server holds, oldest first, with their sizes."""
    rows = session.rows("SHOW BINARY LOGS", "listing the binary logs")
    return [(str(r[0]), int(r[1])) for r in rows]


def _holds(logs: Mapping[str, int], position: tuple[str, int]) -> bool:
    """Whether the binlog files ``logs`` (name: size) hold ``position``."""
    name, offset = position
    return name in logs and offset <= logs[name]


def require_retained(
    session: Session, position: tuple[str, int], whose: str, **context: Any
) -> None:
    """Raise :class:`BinlogGone` unless the server still holds ``position``, the checkpoint's
    of ``whose`` (``dataset orders``), with ``context`` (``dataset=orders``)."""
    logs = dict(binary_logs(session))
    if _holds(logs, position):
        return
    name, offset = position
    oldest = next(iter(logs), "none")
    raise BinlogGone(
        f"the binary log position {name}:{offset} of {whose} is no longer on the server "
        f"(its oldest binlog is {oldest}): the changes since the last capture were purged, "
        "and capturing on would skip them",
        hint=f"take a new snapshot: {RESNAPSHOT}; keep the binlog longer "
        "(binlog_expire_logs_seconds) than the consumer may stay down",
        **context,
        position=f"{name}:{offset}",
    )


def retention_seconds(session: Session) -> int | None:
    """How long the server keeps a closed binlog file (``None``: for ever)."""
    v = _variables(session)
    seconds = int(float(v.get("binlog_expire_logs_seconds", "0") or 0))
    if not seconds:
        seconds = int(float(v.get("expire_logs_days", "0") or 0) * 86_400)
    return seconds or None


def stream_status(session: Session, committed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The server's binlog position and retention, and how long the consumer may stay down.

    A closed binlog file is purged ``retention`` seconds after it was closed,
    which is no earlier than the time of the last event the lake holds
    (``at`` in the checkpoint). So the consumer may stay down at least the
    retention while the committed file is still the server's current one,
    else at least the retention minus the time since that event.
    """
    logs = binary_logs(session)
    retention = retention_seconds(session)
    out: dict[str, Any] = {
        "committed_position": (committed or {}).get("binlog"),
        "current_position": f"{logs[-1][0]}:{logs[-1][1]}" if logs else None,
        "oldest_binlog": logs[0][0] if logs else None,
        "retention_seconds": retention,
        "committed_retained": None,
        "may_stay_down_seconds": None,
    }
    position = position_of(committed)
    if position is None:
        return out
    out["committed_retained"] = _holds(dict(logs), position)
    if not out["committed_retained"]:
        out["may_stay_down_seconds"] = 0
    elif retention is not None:
        if logs and position[0] == logs[-1][0]:
            out["may_stay_down_seconds"] = retention
        else:
            at = (committed or {}).get("at")
            since = (
                (datetime.now(UTC) - datetime.fromisoformat(str(at))).total_seconds()
                if at
                else float(retention)
            )
            out["may_stay_down_seconds"] = max(0, int(retention - since))
    return out
