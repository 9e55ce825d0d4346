"""Random tables of every supported type land in the lake value for value.

Each seed draws a few tables (``_fidelity_run.draw_shape``) of the types
``docs/postgres.md`` and ``docs/mariadb.md`` call supported, fills them with
edge values (NULLs everywhere, array elements too; empty strings and arrays;
characters outside the BMP; quotes, backslashes and control characters;
NaN, infinities and -0.0; the largest and smallest integers and decimals;
dates before 1 and after 9999; microseconds; JSON with unicode escapes and
big numbers; arbitrary bytes), then captures each table twice over: as a
``snapshot`` dataset and, where it has a key, as a ``cdc`` dataset. Three
captures: the first snapshot, then twice a round of random changes (updates
to and from NULL, key changes, deletes, inserts) and a capture. After each
capture every dataset's published rows are compared with the source's, value
by value, in the canonical form ``_fidelity.py`` defines.

The default run takes a few seeds. More, when looking for defects:

    COMBINED_FIDELITY_SEEDS=200 pytest tests/engine/test_fidelity_random.py  # seeds 0..199
    COMBINED_FIDELITY_SEEDS=500-599 pytest tests/engine/test_fidelity_random.py  # seeds 500..599
    COMBINED_FIDELITY_SEED=17 pytest tests/engine/test_fidelity_random.py    # seed 17 alone

A failure names its seed; the seed alone reproduces it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
from tests.engine import _fidelity_run as run
from tests.engine._fidelity import Kind
from tests.engine._fidelity_maria import MariaDB
from tests.engine._fidelity_maria import fresh_database as fresh_maria
from tests.engine._fidelity_maria import kinds as maria_kinds
from tests.engine._fidelity_pg import Postgres, all_kinds, fresh_database
from tests.engine._fidelity_run import Dialect, Shape

from combined.engine import Engine


def seeds() -> list[int]:
    """The seeds to run: ``COMBINED_FIDELITY_SEED``, else ``COMBINED_FIDELITY_SEEDS`` of them."""
    if one := os.environ.get("COMBINED_FIDELITY_SEED"):
        return [int(one)]
    first, _, last = os.environ.get("COMBINED_FIDELITY_SEEDS", "2").rpartition("-")
    return list(range(int(first or 0), int(last) + (1 if first else 0)))


TABLES = 3  # per seed; each keyed table also holds a replication slot while it runs


@pytest.fixture
def pg_fuzz_db(pg_server_dsn: str) -> Iterator[str]:
    """A fresh database named ``hfuzz_...``, dropped with its slots afterwards."""
    with fresh_database(pg_server_dsn, "hfuzz") as dsn:
        yield dsn


def _datasets(shape: Shape, quote: str) -> str:
    """A ``snapshot`` dataset of the table and, when it has a key, a ``cdc`` one.

    The relation's name quotes itself (``quote``) where it holds a dot or the quote.
    """
    table = shape.table
    if "." in table or quote in table:
        table = quote + table.replace(quote, quote * 2) + quote
    key, relation = ", ".join(shape.key), json.dumps(table, ensure_ascii=False)
    lines = f"      s_{shape.name}: {{relation: {relation}, key: [{key}]}}\n"
    if shape.key:
        lines += f"      c_{shape.name}: {{relation: {relation}, key: [{key}], strategy: cdc}}\n"
    return lines


def _check(engine: Engine, source: str, dialect: Dialect, shapes: list[Shape], step: str) -> None:
    problems = []
    for shape in shapes:
        for prefix in ("s", "c") if shape.key else ("s",):
            lake = engine.sql(f'SELECT * FROM {source}."{prefix}_{shape.name}"')
            if diff := run.compare(dialect, shape, lake):
                columns = ", ".join(f"{n} {k.ddl}" for n, k in shape.columns)
                problems.append(f"{prefix}_{shape.name} ({columns}) after {step}: {diff}")
    assert not problems, "\n".join(problems)


def _rounds(
    engine: Engine, source: str, dialect: Dialect, shapes: list[Shape], rng: Random
) -> None:
    for step in ("the first capture", "changes", "more changes"):
        if step != "the first capture":
            for shape in shapes:
                run.change(dialect, rng, shape)
        (result,) = engine.capture()
        assert result.state == "succeeded", f"{step}: {result.error}"
        _check(engine, source, dialect, shapes, step)


def _tables(
    dialect: Dialect,
    rng: Random,
    kinds: list[Kind],
    rid: str,
    setup: Callable[[Shape], list[str]],
    quote: str,
) -> tuple[list[Shape], str]:
    """Draw, create and fill the seed's tables; their datasets' lines of the project."""
    (rid_kind,) = [k for k in kinds if k.ddl == rid]
    shapes = [
        run.draw_shape(rng, f"t{i}", kinds, rid_kind, keyless=rng.random() < 0.2)
        for i in range(TABLES)
    ]
    datasets = ""
    for shape in shapes:
        create, *after = setup(shape)  # after the rows: they hold the column dropped
        assert not dialect.run([create], transaction=False)
        for _ in range(rng.randint(6, 14)):
            run.insert(dialect, rng, shape)
        assert not dialect.run(after, transaction=False)
        datasets += _datasets(shape, quote)
    return shapes, datasets


def _capture(
    root: Path, source: str, config: str, datasets: str, rounds: Callable[[Engine], None]
) -> None:
    project = root / "combined.yaml"
    project.write_text(
        f"version: 1\nlake: ./lake\nsources:\n  {source}:\n{config}    datasets:\n{datasets}"
    )
    engine = Engine.open(project)
    try:
        rounds(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("seed", seeds())
def test_random_postgres_tables_land_value_for_value(
    seed: int, pg_fuzz_db: str, tmp_path: Path
) -> None:
    rng = Random(seed)
    kinds = all_kinds()
    pg = Postgres(pg_fuzz_db)

    def setup(shape: Shape) -> list[str]:
        statements = run.create(pg, rng, shape)
        if shape.key and rng.random() < 0.3:
            statements.append(f"ALTER TABLE {pg.ident(shape.table)} REPLICA IDENTITY FULL")
        return statements

    try:
        extra = {s for k in kinds for s in k.extra}
        assert not pg.run(sorted(extra, key=lambda s: "DOMAIN" in s), transaction=False)
        shapes, datasets = _tables(pg, rng, kinds, "integer", setup, '"')
        name = pg_fuzz_db.rsplit("/", 1)[1]  # slots are the server's: named for the database
        config = (
            "    connector: postgres\n"
            f"    config:\n      dsn: {pg_fuzz_db}\n      slot_prefix: {name}\n"
        )
        _capture(tmp_path, "pg", config, datasets, lambda e: _rounds(e, "pg", pg, shapes, rng))
    finally:
        pg.close()


@pytest.fixture
def maria_fuzz_db(mariadb_server_dsn: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh database named ``hfuzz_...`` (its dsn and connection arguments), dropped after."""
    with fresh_maria(mariadb_server_dsn, "hfuzz") as made:
        yield made


@pytest.mark.parametrize("seed", seeds())
def test_random_mariadb_tables_land_value_for_value(
    seed: int, maria_fuzz_db: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    dsn, kwargs = maria_fuzz_db
    rng = Random(seed)
    db = MariaDB(kwargs)
    try:
        shapes, datasets = _tables(
            db, rng, maria_kinds(), "int", lambda s: run.create(db, rng, s, " ENGINE=InnoDB"), "`"
        )
        config = f"    connector: mariadb\n    config:\n      dsn: {dsn}\n"
        _capture(tmp_path, "db", config, datasets, lambda e: _rounds(e, "db", db, shapes, rng))
    finally:
        db.close()
