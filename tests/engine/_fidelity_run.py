"""Random tables, their changes and the comparison of source and lake, for any dialect.

A :class:`Shape` is drawn from a seed: columns of random kinds (odd names
now and then), a key of one or two key-capable kinds or none at all (the
table then holds a non-unique ``rid`` and repeats rows), and its rows. A
round of changes updates columns (to and from NULL), moves rows to new keys,
deletes and inserts, some of them inside one transaction. Everything a seed
does is decided by ``Random(seed)`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from random import Random
from typing import Any, Protocol

from tests.engine import _fidelity as f
from tests.engine._fidelity import Kind

ODD_NAMES = ["Mixed Case", "a.b", 'quo"te', "sp ace", "é", "select"]
ODD_TABLES = ["Odd.Name", 'quo"te', "back`tick", "Mixed", "é", "order"]  # MariaDB: BMP only


class Dialect(Protocol):
    """What the runner needs of a server."""

    def ident(self, name: str) -> str: ...

    def run(self, statements: Sequence[str], transaction: bool) -> list[str]: ...

    def rows(self, shape: Shape) -> list[tuple[Any, ...]]: ...

    def delete_one(self, shape: Shape, rid: int) -> str: ...

    def keys(self, shape: Shape) -> list[tuple[str, ...]]: ...


@dataclass
class Shape:
    """One random table: its columns, key and the key values its rows hold now."""

    name: str
    columns: list[tuple[str, Kind]]
    key: list[str]
    rows: list[tuple[str, ...]] = field(default_factory=list)  # key literals of each row
    rids: list[int] = field(default_factory=list)  # a keyless table's row numbers
    table: str = ""  # the table's name in the source (``name`` names its datasets)

    def __post_init__(self) -> None:
        self.table = self.table or self.name

    @property
    def kinds(self) -> list[Kind]:
        return [k for _, k in self.columns]

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]

    def kind(self, name: str) -> Kind:
        return dict(self.columns)[name]

    def payload(self) -> list[str]:
        return [n for n in self.names if n not in self.key and n != "rid"]


def draw_shape(rng: Random, name: str, kinds: list[Kind], rid: Kind, keyless: bool) -> Shape:
    """Columns (3 to 8 of them), a key of one or two columns, or none (then ``rid``)."""
    keyable = [k for k in kinds if k.key]
    columns: list[tuple[str, Kind]] = []
    key: list[str] = []
    if keyless:
        columns.append(("rid", rid))
    else:
        for i in range(rng.choice([1, 1, 2])):
            columns.append((f"k{i}", rng.choice(keyable)))
            key.append(f"k{i}")
    odd = list(ODD_NAMES)
    rng.shuffle(odd)
    for i in range(rng.randint(3, 8)):
        label = odd.pop() if odd and rng.random() < 0.2 else f"c{i}"
        columns.append((label, rng.choice(kinds)))
    table = f"{rng.choice(ODD_TABLES)} {name}" if rng.random() < 0.25 else name
    return Shape(name, columns, key, table=table)


def create(dialect: Dialect, rng: Random, shape: Shape, suffix: str = "") -> list[str]:
    """The ``CREATE TABLE`` of a shape; now and then a column dropped from its middle."""
    cols = [f"{dialect.ident(n)} {k.ddl}" for n, k in shape.columns]
    gone = rng.random() < 0.3
    if gone:
        cols.insert(rng.randint(0, len(cols)), f"{dialect.ident('gone')} int DEFAULT 7")
    if shape.key:
        cols.append(f"PRIMARY KEY ({', '.join(dialect.ident(k) for k in shape.key)})")
    table = dialect.ident(shape.table)
    out = [f"CREATE TABLE {table} ({', '.join(cols)}){suffix}"]
    return out + ([f"ALTER TABLE {table} DROP COLUMN {dialect.ident('gone')}"] if gone else [])


def value(rng: Random, kind: Kind, nulls: float = 0.2) -> str:
    """A literal of ``kind``, or NULL."""
    return "NULL" if rng.random() < nulls else kind.draw(rng)


def insert(dialect: Dialect, rng: Random, shape: Shape, tries: int = 8) -> None:
    """Insert one row under a key no row holds (a repeat of a row, now and then, if keyless)."""
    for _ in range(tries):
        lits = {n: (k.draw(rng) if n in shape.key else value(rng, k)) for n, k in shape.columns}
        rid = None
        if not shape.key:
            rid = (
                rng.choice(shape.rids)
                if shape.rids and rng.random() < 0.2
                else len(shape.rids) + 1000
            )
            lits["rid"] = str(rid)
        names = ", ".join(dialect.ident(n) for n in lits)
        table, values = dialect.ident(shape.table), ", ".join(lits.values())
        sql = f"INSERT INTO {table} ({names}) VALUES ({values})"
        if dialect.run([sql], transaction=False):
            continue  # a key some row holds already (or a value the type refuses): draw again
        if rid is not None:
            shape.rids.append(rid)
        else:
            shape.rows.append(tuple(lits[k] for k in shape.key))
        return


def where(dialect: Dialect, shape: Shape, key: tuple[str, ...]) -> str:
    return " AND ".join(f"{dialect.ident(k)} = {v}" for k, v in zip(shape.key, key, strict=True))


def change(dialect: Dialect, rng: Random, shape: Shape) -> None:
    """One round: 5 to 15 updates, key moves, deletes and inserts; some in one transaction.

    Inserts run as they are drawn; the other statements then run in order, all
    in one transaction now and then.
    """
    statements = [_one(dialect, rng, shape) for _ in range(rng.randint(5, 15))]
    dialect.run([s for s in statements if s], transaction=rng.random() < 0.4)
    # A key move onto a key some row holds failed: read back what the rows hold.
    if shape.key:
        shape.rows = dialect.keys(shape)


def _one(dialect: Dialect, rng: Random, shape: Shape) -> str | None:
    roll = rng.random()
    table = dialect.ident(shape.table)
    if roll < 0.25 or not (shape.rows or shape.rids):
        insert(dialect, rng, shape)
        return None
    if roll < 0.65:
        cols = rng.sample(shape.payload(), min(len(shape.payload()), rng.randint(1, 3)))
        sets = ", ".join(f"{dialect.ident(c)} = {value(rng, shape.kind(c), 0.35)}" for c in cols)
        return f"UPDATE {table} SET {sets} WHERE {_pick(dialect, rng, shape)}" if sets else None
    if roll < 0.8 and shape.key:
        i = rng.randrange(len(shape.rows))
        old = shape.rows[i]
        new = tuple(shape.kind(k).draw(rng) for k in shape.key)
        shape.rows[i] = new
        sets = ", ".join(f"{dialect.ident(k)} = {v}" for k, v in zip(shape.key, new, strict=True))
        return f"UPDATE {table} SET {sets} WHERE {where(dialect, shape, old)}"
    if shape.key:
        gone = shape.rows.pop(rng.randrange(len(shape.rows)))
        return f"DELETE FROM {table} WHERE {where(dialect, shape, gone)}"
    return dialect.delete_one(shape, shape.rids.pop(rng.randrange(len(shape.rids))))


def _pick(dialect: Dialect, rng: Random, shape: Shape) -> str:
    if shape.key:
        return where(dialect, shape, rng.choice(shape.rows))
    return f"rid = {rng.choice(shape.rids)}"


def compare(dialect: Dialect, shape: Shape, lake: Any) -> str:
    """The differences between the source's rows and the published ones (empty when equal)."""
    source = dialect.rows(shape)
    return f.differences(source, f.lake_rows(lake, shape.kinds, shape.names))
