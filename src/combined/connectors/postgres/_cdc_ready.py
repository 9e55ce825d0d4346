"""What ``combined check`` verifies of a ``cdc`` dataset's change stream, changing nothing.

A first capture creates the table's publication and slot itself (``combined
cdc setup`` only does it ahead): ``check`` passed a server with
``wal_level=replica``, a role that may not create the publication, or no
replication slot left, and the first capture then failed. It now tells each,
and verifies a publication and a slot that already exist as a capture does.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from combined.connectors.postgres._catalog import parse_relation
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import require_published
from combined.connectors.postgres._replication import _check_wal_level, _control, require_slot
from combined.connectors.postgres._slot_owner import Claim, refuse_unowned
from combined.errors import AuthRejected, ConfigError

__all__ = ["check_ready", "refuse_claimed"]


def quoted(*names: str) -> str:
    """``names`` as one quoted SQL identifier (``"schema"."table"``)."""
    return sql.Identifier(*names).as_string(None)


#: Whether the publication and the slot exist, whether the role may create the
#: publication (CREATE on the database and the table's ownership, or a superuser),
#: and whether the server has a replication slot left.
_READY = """
SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %(slot)s),
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %(slot)s),
  (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
    OR (has_database_privilege(current_database(), 'CREATE')
        AND pg_has_role(c.relowner, 'USAGE')),
  (SELECT count(*) FROM pg_replication_slots)
    < current_setting('max_replication_slots')::int,
  current_setting('max_replication_slots'), current_user::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""


def check_ready(settings: Settings, slot: str, table: str, claim: Claim) -> None:
    """Raise what would stop a capture of ``table``'s change stream through ``slot``: a
    slot and publication that are not ``claim``'s (``_slot_owner``) among the rest
    (``claim.resumed``: the lake holds a checkpoint to resume from: the slot must exist)."""
    schema, name = parse_relation(table)
    resumed = claim.resumed
    with _control(settings, "check the change stream") as conn:
        _check_wal_level(conn)
        refuse_unowned(conn, slot, claim)
        row = conn.execute(_READY, {"slot": slot, "schema": schema, "table": name}).fetchone()
    if row is None:
        return  # (the table is missing: the dataset's own check names it)
    published, slotted, may_publish, room, most, role = row
    if published:
        require_published(settings, slot, table)
    elif not may_publish:
        raise AuthRejected(
            f"publication {slot!r} of {table!r} does not exist yet, and the postgres role "
            f"{role!r} may not create it (a first capture does)",
            hint="creating a publication takes CREATE on the database and ownership of the "
            f"table (or a superuser): have such a role run CREATE PUBLICATION {quoted(slot)} "
            f"FOR TABLE {quoted(schema, name)} (captures then verify it), or grant them",
            publication=slot,
        )
    if slotted or resumed:
        require_slot(settings, slot)  # (SlotLost when a resumed slot is gone)
    elif not room:
        raise ConfigError(
            f"replication slot {slot!r} of {table!r} does not exist yet, and every "
            f"replication slot of the server is taken (max_replication_slots = {most})",
            hint="drop the slots no longer used (`combined cdc status` lists this project's "
            "and the undeclared ones with its slot_prefix), or raise max_replication_slots "
            "and restart postgresql",
            slot=slot,
        )


def refuse_claimed(settings: Settings, claims: Sequence[tuple[str, Claim]]) -> None:
    """Raise what a first capture would refuse of each ``(slot, claim)`` once its Run
    started: a slot of another database, the slot and publication of another project, a
    slot not provably the claimant's (``_slot_owner``). One connection; nothing changed.

    A copied project (its own lake, the same slot_prefix) was refused only inside its
    Run, which ended ``failed``, exit 1, "retry later", where no retry helps.
    """
    if not claims:
        return
    with _control(settings, "check whose the replication slots are") as conn:
        for slot, claim in claims:
            refuse_unowned(conn, slot, claim)
