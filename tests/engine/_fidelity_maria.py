"""MariaDB's column kinds for the random fidelity tests, per ``docs/mariadb.md``.

Text is written as its UTF-8 bytes converted by the server
(``CONVERT(X'..' USING utf8mb4)``), so no escaping can change it; bytes as
``X'..'``. Values read back as the server's text over a utf8mb4 session at
``time_zone = '+00:00'``, undecoded (binary columns as bytes), except
``FLOAT`` (its own text has 6 digits: read as ``CAST(c AS DOUBLE)``) and
``BIT`` (read as ``CAST(c AS UNSIGNED)``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from random import Random
from typing import Any

from tests.engine import _fidelity as f
from tests.engine._fidelity import Kind
from tests.engine._fidelity_pg import json_value
from tests.engine._fidelity_run import Shape


def utf8(value: str, charset: str = "") -> str:
    """A text literal no escaping rule can alter (in ``charset``: its columns compare it)."""
    text = f"CONVERT(X'{value.encode().hex()}' USING utf8mb4)"
    return f"CONVERT({text} USING {charset})" if charset else text


def _int_kinds() -> list[Kind]:
    out = []
    for name, bits in [
        ("tinyint", 8),
        ("smallint", 16),
        ("mediumint", 24),
        ("int", 32),
        ("bigint", 64),
    ]:
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        out.append(Kind(name, f.ints(lo, hi), f.as_int, f.as_int, key=True))
        out.append(Kind(f"{name} unsigned", f.ints(0, 2**bits - 1), f.as_int, f.as_int, key=True))
    return out


def _decimal(p: int, s: int) -> Kind:
    return Kind(
        f"decimal({p},{s})",
        lambda r: f.edge_decimal(r, p, s),
        f.plain_decimal,
        f.plain_decimal,
        key=True,
    )


FITS = {
    "utf8mb4": lambda s: True,
    "utf8mb3": lambda s: all(ord(c) < 0x10000 for c in s),
    "ucs2": lambda s: all(ord(c) < 0x10000 for c in s),
    "utf16": lambda s: True,
    "utf32": lambda s: True,
    "ascii": lambda s: all(ord(c) < 128 for c in s),
    "latin1": lambda s: _cp1252(s),
}


def _cp1252(s: str) -> bool:
    # MariaDB's latin1 is cp1252 with its five unassigned bytes as the C1 controls.
    try:
        s.translate(dict.fromkeys(map(ord, "\x81\x8d\x8f\x90\x9d"))).encode("cp1252")
    except UnicodeEncodeError:
        return False
    return True


def _texts() -> list[Kind]:
    out = []
    for charset, fits in FITS.items():
        for ddl, most, key in [
            ("varchar(12)", 12, True),
            ("char(6)", 6, True),
            ("text", 5000, False),
        ]:

            def draw(rng: Random, fits: Any = fits, most: int = most, cs: str = charset) -> str:
                return utf8(f.text(rng, fits, most), cs)

            out.append(Kind(f"{ddl} character set {charset}", draw, f.same, f.same, key=key))
    out.append(
        Kind(
            "varchar(20) collate utf8mb4_bin",
            lambda r: utf8(f.text(r, most=20)),
            f.same,
            f.same,
            key=True,
        )
    )
    out.append(Kind("mediumtext", lambda r: utf8(f.text(r, most=5000)), f.same, f.same))
    return out


def _bytes(most: int) -> f.Draw:
    def draw(rng: Random) -> str:
        size = rng.choice([0, 1, most, rng.randint(0, most)])
        return "X'" + bytes(rng.randrange(256) for _ in range(size)).hex() + "'"

    return draw


def _date(rng: Random) -> str:
    edges = ["0001-01-01", "1000-01-01", "1969-12-31", "1970-01-01", "2000-02-29", "9999-12-31"]
    if rng.random() < 0.5:
        return rng.choice(edges)
    return f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _stamp(rng: Random) -> str:
    # TIMESTAMP's range: 1970-01-01 00:00:01 to 2038-01-19 03:14:07.999999 UTC.
    if rng.random() < 0.3:
        return rng.choice(
            ["1970-01-01 00:00:01", "2038-01-19 03:14:07.999999", "2000-01-01 00:00:00.000001"]
        )
    day = f"{rng.randint(1971, 2037)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return f"{day} {f.clock(rng)}"


def _temporal() -> list[Kind]:
    out = [Kind("date", lambda r: f"'{_date(r)}'", f.date_days, f.same, key=True)]
    for fsp in (0, 3, 6):
        out.append(
            Kind(
                f"datetime({fsp})",
                lambda r: f"'{_date(r)} {f.clock(r)}'",
                f.stamp_micros,
                f.same,
                key=True,
            )
        )
        out.append(
            Kind(f"timestamp({fsp}) null", lambda r: f"'{_stamp(r)}'", f.stamp_micros, f.same)
        )
        out.append(Kind(f"time({fsp})", lambda r: f"'{f.clock(r)}'", f.time_micros, f.lake_time))
    out.append(
        Kind(
            "year",
            lambda r: r.choice(["1901", "2155", "0", "1970", str(r.randint(1901, 2155))]),
            f.as_int,
            f.as_int,
            key=True,
        )
    )
    return out


ENUM = "enum('a','b','','é😀','quo''te','sp ace')"
SET = "set('a','b','é😀','quo''te','')"


def _set(rng: Random) -> str:
    members = ["a", "b", "é😀", "quo'te"]
    return utf8(",".join(m for m in members if rng.random() < 0.5))


INET6 = ["::1", "2001:db8::1", "fe80::1:2:3:4", "::", "::ffff:1.2.3.4", "::1.2.3.4", "::ffff:0:0"]
INET6 += ["::0.0.1.0", "::ffff:0:1.2.3.4", "0:0:0:0:0:1:0:0", "1:0:0:2:0:0:0:3"]


def kinds() -> list[Kind]:
    """Every supported type of MariaDB 10.11."""
    return [
        *_int_kinds(),
        _decimal(1, 0),
        _decimal(10, 10),
        _decimal(18, 4),
        _decimal(20, 0),
        _decimal(38, 12),
        _decimal(39, 0),
        _decimal(65, 30),
        _decimal(65, 0),
        Kind(
            "float",
            f.floats(["-0", "3.40282e38", "1.17549e-38", "16777216", "0.1", "1e-45"]),
            lambda t: f.single_bits(float(t)),
            f.single_bits,
            select="CAST({c} AS DOUBLE)",
        ),
        Kind(
            "double",
            f.floats(["-0", "1.7976931348623157e308", "2.2250738585072014e-308", "5e-324", "0.1"]),
            lambda t: f.double_bits(float(t)),
            f.double_bits,
        ),
        Kind(
            "bit(1)",
            lambda r: r.choice(["b'0'", "b'1'"]),
            f.as_int,
            f.as_int,
            select="CAST({c} AS UNSIGNED)",
        ),
        Kind(
            "bit(64)",
            lambda r: "b'" + "".join(r.choice("01") for _ in range(64)) + "'",
            f.as_int,
            f.as_int,
            select="CAST({c} AS UNSIGNED)",
        ),
        Kind(
            "bit(7)",
            lambda r: f"b'{r.randrange(128):b}'",
            f.as_int,
            f.as_int,
            select="CAST({c} AS UNSIGNED)",
        ),
        *_texts(),
        Kind(
            ENUM,
            lambda r: utf8(r.choice(["a", "b", "", "é😀", "quo'te", "sp ace"])),
            f.same,
            f.same,
            key=True,
        ),
        Kind(SET, _set, f.same, f.same),
        Kind("json", lambda r: utf8(json_value(r)), f.same, f.same),
        Kind("binary(16)", _bytes(16), f.same, f.same, key=True),
        Kind("varbinary(32)", _bytes(32), f.same, f.same, key=True),
        Kind("blob", _bytes(3000), f.same, f.same),
        Kind("longblob", _bytes(100), f.same, f.same),
        Kind("tinyblob", _bytes(255), f.same, f.same),
        Kind("varchar(8) character set binary", _bytes(8), f.same, f.same, key=True),
        Kind("tinyint(1)", f.ints(-128, 127), f.as_int, f.as_int, key=True),
        Kind(
            "decimal(10,2) unsigned",
            lambda r: f.edge_decimal(r, 10, 2).lstrip("-"),
            f.plain_decimal,
            f.plain_decimal,
            key=True,
        ),
        Kind("tinytext", lambda r: utf8(f.text(r, most=60)), f.same, f.same),
        Kind("longtext", lambda r: utf8(f.text(r, most=5000)), f.same, f.same),
        Kind("nchar(4)", lambda r: utf8(f.text(r, FITS["utf8mb3"], 4)), f.same, f.same, key=True),
        *_temporal(),
        Kind("uuid", lambda r: f"'{uuid.UUID(int=r.getrandbits(128))}'", f.same, f.same, key=True),
        Kind(
            "inet4",
            lambda r: "'" + ".".join(str(r.randrange(256)) for _ in range(4)) + "'",
            f.same,
            f.same,
            key=True,
        ),
        Kind(
            "inet6",
            lambda r: f"'{r.choice(INET6)}'",
            f.same,
            f.same,
        ),
    ]


NUMERIC = (
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "bigint",
    "decimal",
    "year",
    "float",
    "double",
)


class MariaDB:
    """A database of the test server, changed statement by statement."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        import pymysql

        self.conn = pymysql.connect(
            **{**kwargs, "conv": {}, "autocommit": True, "charset": "utf8mb4"}
        )
        with self.conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")

    def close(self) -> None:
        self.conn.close()

    def ident(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def run(self, statements: Sequence[str], transaction: bool) -> list[str]:
        import pymysql

        errors = []
        with self.conn.cursor() as cur:
            if transaction:
                cur.execute("BEGIN")
            for sql in statements:
                try:
                    cur.execute(sql)
                except pymysql.Error as exc:
                    errors.append(f"{sql}: {exc}")
            if transaction:
                cur.execute("COMMIT")
        return errors

    def _select(self, shape: Shape) -> list[tuple[Any, ...]]:
        exprs = [(k.select or "{c}").format(c=self.ident(n)) for n, k in shape.columns]
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(exprs)} FROM {self.ident(shape.table)}")
            return list(cur.fetchall())

    def rows(self, shape: Shape) -> list[tuple[Any, ...]]:
        return [
            tuple(f.canon(k.source, False, v) for v, k in zip(row, shape.kinds, strict=True))
            for row in self._select(shape)
        ]

    def keys(self, shape: Shape) -> list[tuple[str, ...]]:
        at = [shape.names.index(k) for k in shape.key]
        out = []
        for row in self._select(shape):
            out.append(tuple(_literal(shape.kinds[i], row[i]) for i in at))
        return out

    def delete_one(self, shape: Shape, rid: int) -> str:
        return f"DELETE FROM {self.ident(shape.table)} WHERE rid = {rid} LIMIT 1"


def _literal(kind: Kind, value: Any) -> str:
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if kind.ddl.startswith(NUMERIC) or kind.ddl.startswith("bit"):
        return str(value)
    return utf8(value, kind.ddl.split("character set ")[1] if "character set" in kind.ddl else "")


@contextmanager
def fresh_database(server_dsn: str, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A new database ``<prefix>_...`` (its dsn and connection arguments), dropped after."""
    import pymysql

    from combined.connectors.mariadb._connect import Settings

    settings = Settings.from_config({"dsn": server_dsn})
    kwargs = {
        k: v
        for k, v in settings.connect_kwargs().items()
        if k not in ("database", "conv", "cursorclass")
    }
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        ((log_bin,),) = cur.execute("SELECT @@log_bin") and cur.fetchall()
        assert str(log_bin) == "1", "the MariaDB server has log_bin OFF (.ci/run turns it on)"
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield (
            f"{settings.dsn.split('?', 1)[0].rsplit('/', 1)[0]}/{name}",
            {**kwargs, "database": name},
        )
    finally:
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
