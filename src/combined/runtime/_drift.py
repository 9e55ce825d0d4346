"""Schema drift: how a capture's columns differ from the committed ones, and each policy.

Classes: ``new_field``, ``drop``, ``widened_type``, ``narrowed_type`` and
``rename``. A rename is told apart from a drop and a new field only by the
source's own evidence of a column's identity (:attr:`FieldInfo.identity`:
PostgreSQL's ``attnum``, which a rename keeps and a new column never
reuses; MariaDB's column position with its type), recorded in every lake
commit's metadata (``fields``) and compared at the next capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from combined.connectors.abc import DatasetDiscovery
from combined.errors import ConfigError, DriftQuarantined, DriftRejected, SchemaMismatch
from combined.lake import lake_schema

if TYPE_CHECKING:
    from combined.runtime._plan import DatasetPlan


class Declared(dict[str, str]):
    """The discovered Arrow type of each column, with its ``identity`` at the source."""

    identity: dict[str, str]


def declared_fields(found: DatasetDiscovery | None) -> Declared | None:
    """What discovery declares of a dataset's columns (None: it declares nothing)."""
    if found is None:
        return None
    declared = Declared((f.name, f.arrow_type) for f in found.fields)
    declared.identity = {f.name: f.identity for f in found.fields if f.identity is not None}
    return declared


def _renames(
    old: list[str], new: list[str], before: Mapping[str, str], now: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(old, new) names of the columns whose identity the source kept under a new name."""
    by_identity = {now[n]: n for n in new if n in now}
    return [(o, by_identity[before[o]]) for o in old if before.get(o) in by_identity]


def _judged(name: str, before: Mapping[str, str] | None, now: Mapping[str, str] | None) -> bool:
    """Whether a lake column the source lacks was already gone at the last commit.

    A drop or rename that evolved keeps the old column in the lake (Delta
    drops none); the last commit recorded the source's columns without it.
    Judged again, it was a new ``drop`` at every later capture: under the
    default ``drop: fail``, an evolved rename failed every capture after it.
    """
    if not before or not now:
        return False  # the last commit or this read recorded no columns: judge it
    return name not in before and name not in now


def _dropped_since(
    old: Mapping[str, object],
    new: Mapping[str, object],
    before: Mapping[str, str] | None,
    now: Mapping[str, str] | None,
) -> list[str]:
    """Lake columns the source dropped since the last commit, though this capture's rows
    still hold them (changes a change stream logged before the drop).

    Judged now, or never: the next capture's read lacks them, and the last
    commit (this one) recorded the source's columns without them
    (:func:`_judged`), so a binlog's ``DROP COLUMN`` read after changes
    passed ``drop: fail`` unjudged.
    """
    if not before or not now:
        return []
    # (one whose identity another name holds now was renamed, or is told apart from a
    # rename by nothing here: left to the captures after, as before)
    taken = set(now.values())
    return [n for n in old if n in new and n in before and n not in now and before[n] not in taken]


def classify(
    plan: DatasetPlan,
    committed: pa.Schema | None,
    seen: pa.Schema,
    before: Mapping[str, str] | None = None,
    now: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Classify differences between the committed payload schema and a new one.

    ``before`` and ``now`` are the columns' identities at the source when
    last committed and now (a rename is recognised only where both are known).
    """
    if committed is None:
        return []
    events: list[dict[str, Any]] = []
    old = {f.name: f.type for f in committed if not f.name.startswith("_combined_")}
    new = {f.name: f.type for f in lake_schema(seen) if not f.name.startswith("_combined_")}
    source = {f.name: f.type for f in seen}
    added = [n for n in new if n not in old]
    gone = [n for n in old if n not in new and not _judged(n, before, now)]
    for was, name in _renames(gone, added, before or {}, now or {}):
        events.append({"class": "rename", "field": name, "from": was, "type": str(new[name])})
        added.remove(name)
        gone.remove(was)
    # (no rename: the rows hold the column still, as they did before this change)
    gone += _dropped_since(old, new, before, now)
    for name in added:
        events.append({"class": "new_field", "field": name, "type": str(new[name])})
    for name in gone:
        events.append({"class": "drop", "field": name, "type": str(old[name])})
    for name in old.keys() & new.keys():
        if old[name] != new[name]:
            wider = _widens(old[name], new[name], source[name])
            events.append(
                {
                    "class": "widened_type" if wider else "narrowed_type",
                    "field": name,
                    "from": str(old[name]),
                    "to": str(new[name]),
                }
            )
    for e in events:
        e["outcome"] = plan.drift.get(e["class"], "fail")
    return events


def _widens(old: pa.DataType, new: pa.DataType, source: pa.DataType) -> bool:
    """Whether the lake type ``new`` holds every value of ``old``, each under its text.

    An integer made a float is not a widening: a float's identity text is
    its bits (docs/identity.md), so every row would get another id and
    payload hash, be written again and count as an active row, though no
    value changed (and a double rounds integers past 2**53).
    ``source`` is the source's type that ``new`` stores: a decimal of more
    than Delta's 38 digits is kept as its exact text, which holds every
    value of a decimal or an integer it widens. A list, a large list or a
    fixed-size list widens with its elements.
    """
    if pa.types.is_string(new) and pa.types.is_decimal(source) and not pa.types.is_string(old):
        return _widens(old, source, source)
    if _is_list(old) and _is_list(new):
        inner = source.value_type if _is_list(source) else new.value_type
        return _widens(old.value_type, new.value_type, inner)
    if old == new:
        return True
    if pa.types.is_integer(old) and pa.types.is_integer(new):
        return bool(new.bit_width >= old.bit_width)
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return bool(new.bit_width >= old.bit_width)
    if pa.types.is_integer(old) and pa.types.is_decimal(new):
        # (the digits of the type's largest value: int8 3, int16 5, int32 10, int64 19;
        # an unsigned 64-bit 20)
        digits = len(str(2 ** (old.bit_width - (0 if pa.types.is_unsigned_integer(old) else 1))))
        return bool(new.precision - new.scale >= digits)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(
            new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
        )
    return False


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def judge_drift(
    plan: DatasetPlan,
    committed: pa.Schema | None,
    seen: pa.Schema,
    parts: list[Path],
    before: Mapping[str, str] | None = None,
    now: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The capture's drift events against the committed schema, each with its outcome.

    Raises for drift whose policy is not ``evolve``: ``fail`` first, then
    ``quarantine`` (the error carries the events and the staged ``parts``).
    """
    drift = classify(plan, committed, seen, before, now)
    held = [e for e in drift if e["outcome"] != "evolve"]
    if not held:
        return drift
    failing = [e for e in held if e["outcome"] == "fail"]
    first = (failing or held)[0]
    what = (
        f"schema drift in {plan.source}.{plan.name}: {first['class']} "
        f"on field {first['field']!r}"
        + (f" (was {first['from']!r})" if first["class"] == "rename" else "")
        + (
            f" ({first['from']} to {first['to']}: a float's identity text is not an "
            "integer's, so every row would be written again and count as active this month)"
            if first["class"] == "narrowed_type"
            and first["from"].startswith(("int", "uint"))
            and first["to"] in ("halffloat", "float", "double")
            else ""
        )
        + f" (policy: {first['outcome']})"
    )
    accept = f"set drift.{first['class']}: evolve for this dataset in combined.yaml"
    exc = (
        DriftRejected(what, hint=f"{accept} if the change is expected, then capture again")
        if failing
        else DriftQuarantined(
            f"{what}; nothing was committed and the capture is held in quarantine",
            hint=f"review it (`combined quarantine list`); to accept the change, {accept} "
            "and capture again",
        )
    )
    exc.drift = tuple(drift)
    exc.parts = tuple(parts)
    exc.what = what
    raise exc


def check_key(
    plan: DatasetPlan, last: Mapping[str, Any] | None, now: Mapping[str, str] | None
) -> None:
    """Refuse a declared key other than the one the lake's ids were computed from.

    An id is the digest of the key's values (``docs/identity.md``): under
    another key every row gets a new id, so a cursor's re-read rows were
    stored again beside their old versions, a snapshot's deleted and
    inserted again, and both billed again. ``last`` is the lake's newest
    commit (which records its key), ``now`` the columns' identities at the
    source: a key column renamed there keeps its values, and its ids.
    """
    recorded = last.get("key") if last else None
    if not plan.key and plan.sync_mode != "append" and last and last.get("changes_unique") is False:
        # An event stream's rows repeat under ids of whole rows; a mirror's
        # ids number equal rows apart (docs/identity.md, section 9).
        raise ConfigError(
            f"{plan.source}.{plan.name} declares key: [], but its lake holds an event stream "
            "(sync_mode: append): its rows repeat, under ids the mirror does not give them",
            hint="set sync_mode: append again; to mirror the table, declare key: [] on a "
            "dataset of another name (relation: the same table)",
        )
    if plan.sync_mode == "append" or recorded is None or list(recorded) == list(plan.key):
        return
    assert last is not None
    renamed = dict(_renames(list(recorded), list(plan.key), last.get("fields") or {}, now or {}))
    if [renamed.get(k, k) for k in recorded] == list(plan.key):
        return
    raise ConfigError(
        f"{plan.source}.{plan.name} declares the key ({', '.join(plan.key)}), but the ids "
        f"in its lake are of the key ({', '.join(recorded)}): every row would get a new id, "
        "be stored or billed again",
        hint=f"declare key: [{', '.join(recorded)}] again; to capture under the new key, "
        "declare it on a dataset of another name",
    )


def check_moved(
    plan: DatasetPlan,
    last: Mapping[str, Any] | None,
    now: Mapping[str, str] | None,
    lake: pa.Schema | None,
) -> None:
    """Refuse a read of changed rows alone when a lake column's name now names another column.

    Columns swapped by renames (``c`` to ``tmp``, ``d`` to ``c``, ``tmp`` to
    ``d``), or one dropped and another added under its name, keep every
    name the lake holds: no drift showed. A change stream or a cursor read
    carries only the rows changed since, so every other row kept, under
    ``c``, the values of the column that was ``c`` before: the capture
    succeeded and the lake silently held the other column's values. So
    with a column renamed (or added) under the name of one dropped earlier,
    whose former values the lake keeps. The source's identity of each
    column (``attnum``), recorded with the lake's last commit, tells. A
    snapshot reads every row again and needs no check.
    """
    before = last.get("fields") if last else None
    if plan.strategy == "snapshot" or plan.sync_mode == "append" or not before or not now:
        return
    held = set(lake.names) if lake is not None else set()
    # A name absent at the last commit that the lake holds was dropped since
    # (the lake keeps its former values) and now names another column.
    moved = [n for n in now if n in held and before.get(n) != now[n]]
    if not moved:
        return
    which = ", ".join(
        f"{n!r} ({before.get(n, 'absent')} at the last capture, {now[n]} now)" for n in moved
    )
    again = (
        f"take a new snapshot: `combined cdc teardown {plan.source}`, then "
        f"`combined cdc setup {plan.source}`"
        if plan.strategy == "cdc"
        else "read every row again: capture the dataset once with strategy: snapshot"
    )
    raise SchemaMismatch(
        f"a column name of {plan.source}.{plan.name} now names another column of the "
        f"source (renamed, or dropped and added again): {which}; the rows this "
        f"{plan.strategy} read does not carry would keep the former column's values there",
        hint=f"{again}; or rename the columns back. Nothing was committed for this dataset",
        dataset=f"{plan.source}.{plan.name}",
        column=moved[0],
    )
