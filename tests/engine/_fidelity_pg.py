"""PostgreSQL's column kinds for the random fidelity tests, per ``docs/postgres.md``.

Each value is written as a literal cast to its column's type; each reads
back as ``format('%s', value)`` (the type's output function, so ``char(n)``
keeps its padding), in a session at ``TimeZone = UTC``, ``DateStyle = ISO``
and ``extra_float_digits = 1`` (the shortest text that reads back exactly).
An array reads as the JSON list of its elements' texts (NULL elements kept).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from random import Random

from tests.engine import _fidelity as f
from tests.engine._fidelity import Kind
from tests.engine._fidelity_run import Shape

SESSION = (
    "SET TimeZone = 'UTC'",
    "SET DateStyle = 'ISO, YMD'",
    "SET extra_float_digits = 1",
    "SET IntervalStyle = 'postgres'",
)


def quote(value: str) -> str:
    """A SQL string literal (standard_conforming_strings is on)."""
    return "'" + value.replace("'", "''") + "'"


def ident(name: str) -> str:
    """A quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def select(column: str, kind: Kind) -> str:
    """The expression reading ``column`` as its canonical source text."""
    c = ident(column)
    if kind.array:
        elem = "CASE WHEN x IS NULL THEN NULL ELSE format('%s', x) END"
        agg = f"(SELECT json_agg({elem} ORDER BY o) FROM unnest({c}) WITH ORDINALITY u(x, o))"
        return f"CASE WHEN {c} IS NULL THEN NULL ELSE COALESCE({agg}, '[]'::json) END"
    return f"CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END"


def _lit(cast: str, draw: f.Draw) -> f.Draw:
    return lambda rng: f"{quote(draw(rng))}::{cast}"


FLOAT4 = ["NaN", "Infinity", "-Infinity", "-0", "1.4e-45", "3.4028235e+38", "1.1754944e-38"]
FLOAT8 = ["NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e+308", "0.1"]


DATES = ["4713-01-01 BC", "0001-12-31 BC", "0001-01-01", "1900-02-28", "1969-12-31"]
DATES += ["1970-01-01", "2000-02-29", "2038-01-19", "9999-12-31", "10000-01-01", "200000-06-15"]


def _date(rng: Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(DATES)
    return f"{rng.randint(1, 3000):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _stamp(rng: Random) -> str:
    day = _date(rng)
    bc = day.endswith(" BC")
    return day.removesuffix(" BC") + " " + f.clock(rng) + (" BC" if bc else "")


def _stamptz(rng: Random) -> str:
    zone = rng.choice(["+00", "+05:30", "-08", "+14", "-12:45", " UTC"])
    day = _date(rng)
    if day.endswith(" BC"):
        return day.removesuffix(" BC") + " " + f.clock(rng) + zone + " BC"
    return day + " " + f.clock(rng) + zone


def json_value(rng: Random, depth: int = 0, jsonb: bool = False) -> str:
    """A JSON text: nested unicode escapes, big numbers, duplicate keys, odd spacing."""
    roll = rng.randrange(8 if depth < 3 else 4)
    if roll == 0:
        return rng.choice(
            ["1e400", "123456789012345678901234567890", "-0", "0.1", "1E-7", "-1.5e+300"]
        )
    if roll == 1:
        return rng.choice(["true", "false", "null", "0", "18446744073709551615"])
    if roll in (2, 3):
        escapes = ["\\u00e9", "\\ud83d\\ude00", '\\"', "\\\\", "\\n", "\\/", "é", "😀", "a", "\\t"]
        if not jsonb:
            escapes.append("\\u0000")
        return '"' + "".join(rng.choice(escapes) for _ in range(rng.randint(0, 5))) + '"'
    if roll in (4, 5):
        items = [json_value(rng, depth + 1, jsonb) for _ in range(rng.randint(0, 3))]
        return "[" + rng.choice([",", ", ", " ,\n"]).join(items) + "]"
    keys = ["a", "b", "a", "\\u00e9", "😀", ""]
    pairs = [
        f'"{rng.choice(keys)}": {json_value(rng, depth + 1, jsonb)}'
        for _ in range(rng.randint(0, 3))
    ]
    return "{" + ", ".join(pairs) + "}"


def _bytes(rng: Random) -> str:
    size = rng.choice([0, 1, 2, 16, rng.randint(0, 40), 3000 if rng.random() < 0.1 else 5])
    return "'\\x" + bytes(rng.randrange(256) for _ in range(size)).hex() + "'::bytea"


def _uuid(rng: Random) -> str:
    text = str(uuid.UUID(int=rng.getrandbits(128)))
    return quote(text.upper() if rng.random() < 0.3 else text) + "::uuid"


def _numeric(precision: int, scale: int) -> Kind:
    return Kind(
        f"numeric({precision},{scale})",
        _lit(f"numeric({precision},{scale})", lambda r: f.edge_decimal(r, precision, scale)),
        f.plain_decimal,
        f.plain_decimal,
        key=True,
    )


def _free_numeric(rng: Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(["NaN", "Infinity", "-Infinity", "0." + "0" * 300 + "1", "1" + "0" * 130])
    p = rng.randint(1, 90)
    return f.edge_decimal(rng, p, rng.randint(0, p))


def _text_of(cast: str, most: int) -> f.Draw:
    return _lit(cast, lambda r: f.text(r, most=most))


def _bits(rng: Random, n: int) -> str:
    return "".join(rng.choice("01") for _ in range(n))


def _text_kind(ddl: str, draw: f.Draw, key: bool = False, extra: tuple[str, ...] = ()) -> Kind:
    return Kind(ddl, draw, f.same, f.same, key=key, extra=extra)


def _inet(rng: Random) -> str:
    if rng.random() < 0.5:
        return quote(".".join(str(rng.randrange(256)) for _ in range(4)) + f"/{rng.randint(8, 32)}")
    groups = ":".join(f"{rng.randrange(65536):x}" for _ in range(8))
    return quote(rng.choice([groups, "::1", "::ffff:1.2.3.4", "fe80::1"]))


def _cidr(rng: Random) -> str:
    return quote(
        rng.choice(["10.0.0.0/8", "192.168.1.0/24", "::/0", "2001:db8::/32", "1.2.3.4/32"])
    )


def kinds() -> list[Kind]:
    """Every supported scalar type; arrays of them follow in :func:`arrays`."""
    mood = "CREATE TYPE mood AS ENUM ('sad', 'ok', 'with space', 'quo''te', 'é😀', '')"
    posint = "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)"
    return [
        Kind("smallint", f.ints(-(2**15), 2**15 - 1), f.as_int, f.as_int, key=True),
        Kind("integer", f.ints(-(2**31), 2**31 - 1), f.as_int, f.as_int, key=True),
        Kind("bigint", f.ints(-(2**63), 2**63 - 1), f.as_int, f.as_int, key=True),
        Kind("boolean", lambda r: r.choice(["true", "false"]), lambda t: t == "t", bool, key=True),
        Kind(
            "real", _lit("real", f.floats(FLOAT4)), lambda t: f.single_bits(float(t)), f.single_bits
        ),
        Kind(
            "double precision",
            _lit("double precision", f.floats(FLOAT8)),
            lambda t: f.double_bits(float(t)),
            f.double_bits,
        ),
        _numeric(1, 0),
        _numeric(18, 6),
        _numeric(38, 38),
        _numeric(38, 0),
        _numeric(20, 10),
        _numeric(50, 20),
        _numeric(76, 38),
        Kind(
            "numeric(5,-2)",
            _lit("numeric(5,-2)", lambda r: f.edge_decimal(r, 7, 0)[:-2] + "00"),
            f.plain_decimal,
            f.plain_decimal,
            key=True,
        ),
        Kind(
            "numeric(3,5)",
            _lit("numeric(3,5)", lambda r: r.choice(["", "-"]) + f"0.00{r.randrange(1000):03d}"),
            f.plain_decimal,
            f.plain_decimal,
        ),
        Kind(
            "numeric(100,30)",
            _lit("numeric(100,30)", lambda r: f.edge_decimal(r, 100, 30)),
            f.plain_decimal,
            f.plain_decimal,
        ),
        _text_kind("numeric", _lit("numeric", _free_numeric)),
        _text_kind("text", _text_of("text", 5000), key=True),
        _text_kind("varchar(12)", _text_of("varchar(12)", 12), key=True),
        _text_kind("char(5)", _text_of("char(5)", 5), key=True),
        _text_kind("name", _text_of("name", 20)),
        _text_kind(
            "citext", _text_of("citext", 12), extra=("CREATE EXTENSION IF NOT EXISTS citext",)
        ),
        Kind("bytea", _bytes, lambda t: bytes.fromhex(t[2:]), bytes, key=True),
        Kind("date", _lit("date", _date), f.date_days, f.same, key=True),
        Kind("timestamp", _lit("timestamp", _stamp), f.stamp_micros, f.same, key=True),
        Kind("timestamptz", _lit("timestamptz", _stamptz), f.stamp_micros, f.same, key=True),
        Kind("time", _lit("time", f.clock), f.time_micros, f.lake_time),
        _text_kind(
            "timetz", _lit("timetz", lambda r: f.clock(r) + r.choice(["+00", "+05:30", "-08"]))
        ),
        _text_kind("uuid", _uuid, key=True),
        _text_kind("json", lambda r: quote(json_value(r)) + "::json"),
        _text_kind("jsonb", lambda r: quote(json_value(r, jsonb=True)) + "::jsonb"),
        _text_kind(
            "mood",
            lambda r: quote(r.choice(["sad", "ok", "with space", "quo'te", "é😀", ""])) + "::mood",
            key=True,
            extra=(mood,),
        ),
        _text_kind("inet", lambda r: _inet(r) + "::inet"),
        _text_kind("cidr", lambda r: _cidr(r) + "::cidr"),
        _text_kind(
            "macaddr",
            lambda r: quote(":".join(f"{r.randrange(256):02x}" for _ in range(6))) + "::macaddr",
        ),
        _text_kind(
            "xml",
            lambda r: quote(r.choice(["<a/>", "<a b='1'>é&amp;😀</a>", "text", ""])) + "::xml",
        ),
        _text_kind("bit(5)", lambda r: f"B'{_bits(r, 5)}'"),
        _text_kind("varbit(10)", lambda r: f"B'{_bits(r, r.randint(0, 10))}'"),
        _text_kind(
            "pg_lsn", lambda r: quote(f"{r.randrange(2**32):X}/{r.randrange(2**32):X}") + "::pg_lsn"
        ),
        Kind("oid", f.ints(0, 2**32 - 1), f.as_int, f.as_int),
        _text_kind('"char"', _lit('"char"', lambda r: r.choice(["a", "", "Z", "'", "\\"]))),
        _text_kind("varchar", _text_of("varchar", 5000), key=True),
        _text_kind(
            "macaddr8",
            lambda r: quote(":".join(f"{r.randrange(256):02x}" for _ in range(8))) + "::macaddr8",
        ),
        _text_kind(
            "jsonpath",
            lambda r: (
                quote(r.choice(["$.a", "$[*] ? (@ > 1)", '$."é😀"', "strict $.a.b"])) + "::jsonpath"
            ),
        ),
        Kind("posint", f.ints(1, 2**31 - 1), f.as_int, f.as_int, key=True, extra=(posint,)),
    ]


ARRAYABLE = {
    "smallint", "integer", "bigint", "boolean", "real", "double precision", "numeric(18,6)",
    "numeric(50,20)", "numeric", "text", "varchar(12)", "char(5)", "bytea", "date", "timestamp",
    "timestamptz", "time", "uuid", "jsonb", "mood", "inet", "timetz", "bit(5)", "varbit(10)",
    "macaddr", "cidr", "xml", "json", "pg_lsn", "oid", '"char"', "name", "citext", "posint",
    "macaddr8", "varchar", "numeric(5,-2)", "numeric(3,5)",
}  # fmt: skip


def arrays(scalars: list[Kind]) -> list[Kind]:
    """One-dimensional arrays of the scalar kinds: NULL elements, empty arrays."""
    out = []
    for kind in scalars:
        if kind.ddl not in ARRAYABLE:
            continue

        def draw(rng: Random, kind: Kind = kind) -> str:
            if rng.random() < 0.15:
                return f"'{{}}'::{kind.ddl}[]"
            items = [
                "NULL" if rng.random() < 0.2 else kind.draw(rng) for _ in range(rng.randint(1, 4))
            ]
            return f"ARRAY[{', '.join(items)}]::{kind.ddl}[]"

        out.append(
            Kind(f"{kind.ddl}[]", draw, kind.source, kind.lake, array=True, extra=kind.extra)
        )
    return out


def all_kinds() -> list[Kind]:
    """Scalars and arrays."""
    scalars = kinds()
    return scalars + arrays(scalars)


def loads(value: object) -> object:
    """psycopg returns json as Python already; a str is parsed."""
    return json.loads(value) if isinstance(value, str) else value


class Postgres:
    """A database of the test server, changed statement by statement."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        for statement in SESSION:
            self.conn.execute(statement)
        self.failures: list[str] = []

    def close(self) -> None:
        self.conn.close()

    def ident(self, name: str) -> str:
        return ident(name)

    def run(self, statements: Sequence[str], transaction: bool) -> list[str]:
        """Run each statement; return the errors of those the server refused."""
        import psycopg

        errors = []
        with self.conn.transaction() if transaction else nullcontext():
            for sql in statements:
                try:
                    with self.conn.transaction():
                        self.conn.execute(sql)
                except psycopg.Error as exc:
                    errors.append(f"{sql}: {exc}")
        return errors

    def rows(self, shape: Shape) -> list[tuple[object, ...]]:
        exprs = ", ".join(select(n, k) for n, k in shape.columns)
        out = []
        for row in self.conn.execute(f"SELECT {exprs} FROM {ident(shape.table)}"):
            out.append(
                tuple(
                    f.canon(k.source, k.array, loads(v) if k.array else v)
                    for v, k in zip(row, shape.kinds, strict=True)
                )
            )
        return out

    def keys(self, shape: Shape) -> list[tuple[str, ...]]:
        cols = ", ".join(f"format('%s', {ident(k)})" for k in shape.key)
        casts = [shape.kind(k).ddl for k in shape.key]
        return [
            tuple(f"{quote(v)}::{c}" for v, c in zip(row, casts, strict=True))
            for row in self.conn.execute(f"SELECT {cols} FROM {ident(shape.table)}")
        ]

    def delete_one(self, shape: Shape, rid: int) -> str:
        t = ident(shape.table)
        return f"DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE rid = {rid} LIMIT 1)"


@contextmanager
def fresh_database(server_dsn: str, prefix: str) -> Iterator[str]:
    """A new database ``<prefix>_...`` (its dsn), dropped after with its slots."""
    import psycopg
    from tests.pg_cleanup import drop_database

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server_dsn.rsplit('/', 1)[0]}/{name}"
    finally:
        drop_database(server_dsn, name)
