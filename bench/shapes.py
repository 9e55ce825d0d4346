"""Table shapes beyond the three headline ones, for hunting cliffs (``--shape``).

Each is a :class:`bench.workload.Shape` with an ``id bigint`` column (the
change's rows are chosen by ``id % 100`` and inserted above ``max(id)``)
and an ``updated_at timestamptz`` (bumped by the update), whatever its key:

* ``wide300``: 300 columns cycling int, text, numeric(12,2), timestamptz, bool.
* ``jsonbig``: one jsonb value of 200 KB-1 MB a row.
* ``byteabig``: one bytea value of 5-10 MB a row.
* ``uuidkey`` / ``longkey`` / ``compkey``: a text key (a uuid as text; 100
  characters) and a three-column key (int, text, date).
* ``tiny``: ``(id bigint, s smallint)``, no ``updated_at``: per-row overheads.
* ``intarray``: an ``int[]`` of 1,000 elements a row.
* ``numeric38``: eight ``numeric(38,10)`` columns.
* ``timestamps``: eight timestamp, timestamptz and date columns.
* ``nopk``: the narrow table without a primary key (the dataset's key is ``id``).
* ``parted``: the narrow table hash-partitioned by ``id`` into four partitions.

Everything is deterministic, as in :mod:`bench.workload`.
"""

from __future__ import annotations

from bench.workload import Shape

_KINDS = (
    ("integer", "((g * {i}) % 100000)::int"),
    ("text", "'v{i}-' || (g % 1000)"),
    ("numeric(12,2)", "round((((g * {i}) % 100000) / 100.0)::numeric, 2)"),
    ("timestamptz", "timestamptz '2020-01-01 00:00:00+00' + (g + {i}) * interval '1 second'"),
    ("boolean", "(g + {i}) % 3 = 0"),
)


def _cycled(count: int, every: int | None = None) -> tuple[str, str]:
    """``count`` columns of :data:`_KINDS` after ``id`` and ``updated_at``; with ``every``,
    each value NULL but in one row of ``every``."""
    columns = ["id bigint PRIMARY KEY", "updated_at timestamptz NOT NULL"]
    values = ["g", "timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second'"]
    for i in range(count):
        kind, value = _KINDS[i % len(_KINDS)]
        columns.append(f"c{i} {kind}")
        value = value.format(i=i + 1)
        values.append(
            value if every is None else f"CASE WHEN (g + {i}) % {every} = 0 THEN {value} END"
        )
    return ", ".join(columns), _fill(", ".join(values))


def _wide300() -> tuple[str, str]:
    return _cycled(298)


def _sparse300() -> tuple[str, str]:
    """300 columns of :data:`_KINDS`, each NULL in 19 rows of 20."""
    return _cycled(300, every=20)


_STAMP = "timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second'"


def _fill(values: str) -> str:
    return (
        "INSERT INTO {t} SELECT "
        + values
        + " FROM generate_series({lo}::bigint, {hi}::bigint) AS g"
    )


# 200 KB-1 MB of JSON: an array of 32-hex strings (~35 bytes each) that pglz barely shrinks.
_JSON = (
    "(SELECT jsonb_build_object('id', g, 'xs', jsonb_agg(md5((g * 100000 + x)::text))) "
    "FROM generate_series(1, 5800 + (g % 5) * 5800) AS x)"
)
# 5-10 MB of bytea: md5 digests, which do not compress.
_BYTEA = (
    "(SELECT string_agg(decode(md5((g * 1000000 + x)::text), 'hex'), ''::bytea) "
    "FROM generate_series(1, 327680 + (g % 6) * 65536) AS x)"
)

_TEXT_KEYED = (
    "k text PRIMARY KEY, id bigint NOT NULL, n integer NOT NULL, updated_at timestamptz NOT NULL"
)
_NARROW = "id bigint {pk}, n integer NOT NULL, label text NOT NULL, updated_at timestamptz NOT NULL"
_NARROW_FILL = _fill("g, ((g * 7919) % 100000)::int, 'item ' || (g % 1000), " + _STAMP)
_NARROW_UPDATE = "label = 'updated', updated_at = now()"

WIDE300_COLUMNS, WIDE300_FILL = _wide300()
SPARSE300_COLUMNS, SPARSE300_FILL = _sparse300()

CLIFF_SHAPES: dict[str, Shape] = {
    "wide300": Shape(
        "wide300",
        "wide300",
        100_000,
        WIDE300_COLUMNS,
        WIDE300_FILL,
        "c0 = c0 + 1, updated_at = now()",
    ),
    "jsonbig": Shape(
        "jsonbig",
        "jsonbig",
        1_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, doc jsonb NOT NULL",
        _fill(f"g, {_STAMP}, {_JSON}"),
        "updated_at = now()",
    ),
    "byteabig": Shape(
        "byteabig",
        "byteabig",
        40,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, blob bytea NOT NULL",
        _fill(f"g, {_STAMP}, {_BYTEA}"),
        "updated_at = now()",
        external=("blob",),
    ),
    "uuidkey": Shape(
        "uuidkey",
        "uuidkey",
        1_000_000,
        _TEXT_KEYED,
        _fill(f"md5(g::text)::uuid::text, g, ((g * 7919) % 100000)::int, {_STAMP}"),
        "n = n + 1, updated_at = now()",
        key=("k",),
    ),
    "longkey": Shape(
        "longkey",
        "longkey",
        1_000_000,
        _TEXT_KEYED,
        _fill(
            "'customer/' || md5(g::text) || '/' || md5((g + 1)::text) || '/' || "
            f"lpad(g::text, 25, '0'), g, ((g * 7919) % 100000)::int, {_STAMP}"
        ),
        "n = n + 1, updated_at = now()",
        key=("k",),
    ),
    "compkey": Shape(
        "compkey",
        "compkey",
        1_000_000,
        "a integer NOT NULL, b text NOT NULL, c date NOT NULL, id bigint NOT NULL, "
        "n integer NOT NULL, updated_at timestamptz NOT NULL, PRIMARY KEY (a, b, c)",
        _fill(
            "(g % 1000)::int, 'region-' || (g / 1000 % 100), "
            f"date '2020-01-01' + (g / 100000)::int, g, ((g * 7919) % 100000)::int, {_STAMP}"
        ),
        "n = n + 1, updated_at = now()",
        key=("a", "b", "c"),
    ),
    "tiny": Shape(
        "tiny",
        "tiny",
        20_000_000,
        "id bigint PRIMARY KEY, s smallint NOT NULL",
        _fill("g, (g % 30000)::smallint"),
        "s = s + 1",
        index=False,
    ),
    "intarray": Shape(
        "intarray",
        "intarray",
        50_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, xs integer[] NOT NULL",
        _fill(
            f"g, {_STAMP}, (SELECT array_agg(((g * x) % 1000003)::int) "
            "FROM generate_series(1, 1000) AS x)"
        ),
        "updated_at = now()",
    ),
    "numeric38": Shape(
        "numeric38",
        "numeric38",
        1_000_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, "
        + ", ".join(f"d{i} numeric(38,10) NOT NULL" for i in range(8)),
        _fill(
            f"g, {_STAMP}, "
            + ", ".join(
                f"round(((g * {7919 + i})::numeric * 1234567.123456789 / 7) , 10)" for i in range(8)
            )
        ),
        "d0 = d0 + 1, updated_at = now()",
    ),
    "timestamps": Shape(
        "timestamps",
        "timestamps",
        1_000_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, "
        "t0 timestamptz, t1 timestamptz, t2 timestamp, t3 timestamp, t4 date, t5 date, "
        "t6 timestamptz(3), t7 time",
        _fill(
            f"g, {_STAMP}, {_STAMP} + interval '1 ms' * g, "
            "CASE WHEN g % 10 = 0 THEN NULL "
            "ELSE timestamptz '2000-01-01' + g * interval '7 minutes' END, "
            "timestamp '2020-01-01' + g * interval '1 second', "
            "timestamp '1900-01-01' + g * interval '1 hour', "
            "date '2020-01-01' + (g % 3650)::int, date '1970-01-01' + (g % 40000)::int, "
            "timestamptz '2020-01-01' + g * interval '1.234 ms', "
            "time '00:00' + (g % 86400) * interval '1 second'"
        ),
        "t0 = now(), updated_at = now()",
    ),
    "nopk": Shape(
        "nopk", "nopk", 2_000_000, _NARROW.format(pk="NOT NULL"), _NARROW_FILL, _NARROW_UPDATE
    ),
    "parted": Shape(
        "parted",
        "parted",
        2_000_000,
        _NARROW.format(pk="PRIMARY KEY"),
        _NARROW_FILL,
        _NARROW_UPDATE,
        partitions=4,
    ),
    # -- shapes a reviewer might bring (forty-ninth session) --
    "sparse300": Shape(
        "sparse300",
        "sparse300",
        100_000,
        SPARSE300_COLUMNS,
        SPARSE300_FILL,
        "c0 = coalesce(c0, 0) + 1, updated_at = now()",
    ),
    "prefix3": Shape(
        "prefix3",
        "prefix3",
        1_000_000,
        "a text NOT NULL, b text NOT NULL, c text NOT NULL, id bigint NOT NULL, "
        "n integer NOT NULL, updated_at timestamptz NOT NULL, PRIMARY KEY (a, b, c)",
        _fill(
            "'tenant/acme-corporation-international-holdings-limited/' || (g % 10), "
            "repeat('region/', 12) || (g / 10 % 100), "
            "'https://example.com/a/very/long/shared/path/prefix/of/objects/' || "
            f"lpad(g::text, 12, '0'), g, ((g * 7919) % 100000)::int, {_STAMP}"
        ),
        "n = n + 1, updated_at = now()",
        key=("a", "b", "c"),
    ),
    "uuidnative": Shape(
        "uuidnative",
        "uuidnative",
        1_000_000,
        "k uuid PRIMARY KEY, id bigint NOT NULL, n integer NOT NULL, "
        "updated_at timestamptz NOT NULL",
        _fill(f"md5(g::text)::uuid, g, ((g * 7919) % 100000)::int, {_STAMP}"),
        "n = n + 1, updated_at = now()",
        key=("k",),
    ),
    "byteakey": Shape(
        "byteakey",
        "byteakey",
        1_000_000,
        "k bytea PRIMARY KEY, id bigint NOT NULL, n integer NOT NULL, "
        "updated_at timestamptz NOT NULL",
        _fill(
            "decode(md5(g::text), 'hex') || decode(lpad(to_hex(g), 16, '0'), 'hex'), g, "
            f"((g * 7919) % 100000)::int, {_STAMP}"
        ),
        "n = n + 1, updated_at = now()",
        key=("k",),
    ),
    "skewkey": Shape(
        "skewkey",
        "skewkey",
        1_000_000,
        "k bigint PRIMARY KEY, id bigint NOT NULL, n integer NOT NULL, "
        "updated_at timestamptz NOT NULL",
        _fill(
            "CASE g % 3 WHEN 0 THEN -9223372036854775807 + g * 7 "
            "WHEN 1 THEN 9223372036854775807 - g * 11 ELSE (g - 500000) * 1000003 END, g, "
            f"((g * 7919) % 100000)::int, {_STAMP}"
        ),
        "n = n + 1, updated_at = now()",
        key=("k",),
    ),
    "toast20k": Shape(
        "toast20k",
        "toast20k",
        10_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, body text NOT NULL",
        _fill(
            f"g, {_STAMP}, (SELECT string_agg(md5((g * 1000 + x)::text), '') "
            "FROM generate_series(1, 600 + (g % 50)) AS x)"
        ),
        "updated_at = now()",
    ),
    "bignum": Shape(
        "bignum",
        "bignum",
        500_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, "
        "u numeric, w numeric(60,20), x numeric",
        _fill(
            f"g, {_STAMP}, "
            "CASE WHEN g % 1000 = 1 THEN 'NaN'::numeric WHEN g % 1000 = 2 THEN 'Infinity' "
            "WHEN g % 1000 = 3 THEN '-Infinity' "
            "ELSE (g::numeric * 123456789012345678901234567890.123456789) / 7 END, "
            "(g::numeric * 1234567890123456789012345.6789) / 3, "
            "CASE WHEN g % 2 = 0 THEN g::numeric ELSE (10::numeric ^ (g % 90)) + g / 3.0 END"
        ),
        "u = u + 1, updated_at = now()",
    ),
    "deepjson": Shape(
        "deepjson",
        "deepjson",
        100_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, doc jsonb NOT NULL",
        _fill(
            f"g, {_STAMP}, (repeat('[1, ' || chr(123) || '\"a\": ', 40) || g || "
            "repeat(chr(125) || ']', 40))::jsonb"
        ),
        "updated_at = now()",
    ),
    "tzedge": Shape(
        "tzedge",
        "tzedge",
        1_000_000,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, "
        "t0 timestamptz, t1 timestamp, t2 date, t3 timestamptz",
        _fill(
            f"g, {_STAMP}, "
            "CASE g % 500 WHEN 0 THEN timestamptz '4713-01-01 00:00:00+00 BC' "
            "WHEN 1 THEN timestamptz '294246-12-31 23:59:59.999999+00' "
            "ELSE timestamptz '2021-03-28 00:30:00 Europe/Berlin' "
            "+ (g % 7200) * interval '1 second' END, "
            "CASE g % 500 WHEN 0 THEN timestamp '4713-01-01 00:00:00 BC' "
            "WHEN 1 THEN timestamp '294246-12-31 23:59:59.999999' "
            "ELSE timestamp '2021-11-07 01:00:00' + (g % 7200) * interval '1 second' END, "
            "CASE g % 500 WHEN 0 THEN date '4713-01-01 BC' WHEN 1 THEN date '5874897-12-31' "
            "ELSE date '2021-03-28' + (g % 3)::int END, "
            "timestamptz '0001-01-01 00:00:00+00' + g * interval '1 day'"
        ),
        "t0 = now(), updated_at = now()",
    ),
}
