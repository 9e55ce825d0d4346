"""Captures killed at random moments, then run again: nothing lost, nothing twice.

``test_crash_safety.py`` kills a capture at named boundaries
(``COMBINED_FAULT``). Here a real ``combined capture`` (or ``combined cdc
follow``) subprocess of a real PostgreSQL or MariaDB source is sent SIGKILL
after a random delay drawn from the capture's own duration, sometimes twice
in a row, sometimes followed by ``combined repair``; then a capture runs to
completion. Between rounds the source changes at random: inserts, updates
(to and from NULL, of large text stored out of line, leaving it alone),
deletes, primary-key moves, now and then a TRUNCATE, some in one
transaction, now and then while the killed process runs.

One table is captured three ways at once: ``snapshot`` and ``cursor`` (over
a column a trigger bumps) in source ``ps``, ``cdc`` (the slot, or the
binlog) in source ``pc``. After each completed capture:

- each dataset's published rows equal the source's value for value in the
  canonical forms of ``_fidelity.py`` (the cursor's: every row it has seen,
  deleted ones at the last value it read, since a cursor sees no delete);
- each ``_combined_id`` once in the table, each data file once in its version;
- MAR: the month's counts the catalog shows equal those recounted from the
  usage table, which holds each (month, identity, operation) once; its
  identities are at least those whose row changed between completed
  captures and at most those some statement touched (an audit trigger
  records them; the cursor's, with no change beside a kill, exactly the
  changed ones);
- a dataset with ``history: true`` (each dataset, one seed in two): its current
  versions are its table's rows, and each identity's versions follow one
  another (one open at most, none ending before it begins or after the next begins);
- each dataset's committed Delivery sequences run 1..n, the catalog's last
  one the lake's; every Run is terminal; the staging area is empty;
- after every kill: the slot's ``confirmed_flush_lsn`` is not past the LSN
  of the lake's newest commit (the barrier).

At the end of a seed ``replay`` rebuilds each dataset from its raw layer and
finds the table's rows. The PostgreSQL seeds also run with the lake in a
bucket of an S3 server on 127.0.0.1 (a kill lands in an upload or in the
Delta log's conditional write). The default runs seed 1 (about 30 s a dialect on an
idle machine). More seeds, when looking for defects:

    COMBINED_CRASH_SEEDS=200 pytest tests/engine/test_crash_random.py      # seeds 0..199
    COMBINED_CRASH_SEEDS=500-599 pytest tests/engine/test_crash_random.py  # seeds 500..599
    COMBINED_CRASH_SEED=17 pytest tests/engine/test_crash_random.py        # seed 17 alone
    COMBINED_CRASH_ROUNDS=5 ...                                            # 5 rounds a seed

A failure names its seed and round. The seed decides every statement, every
kill's delay and command; where a kill lands in the capture depends on the
machine's speed, so a seed replays the same source, not always the same crash.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from random import Random
from typing import Any

import pytest
from tests.engine import _fidelity as f
from tests.engine._fidelity import Kind
from tests.engine._fidelity_pg import Postgres, all_kinds, fresh_database, quote
from tests.engine._fidelity_run import Shape

from combined.engine import Engine
from combined.lake import LakeTable

pytestmark = [pytest.mark.slow]


def seeds() -> list[int]:
    """``COMBINED_CRASH_SEED`` alone, else ``COMBINED_CRASH_SEEDS`` of them (``N`` or ``A-B``)."""
    if one := os.environ.get("COMBINED_CRASH_SEED"):
        return [int(one)]
    first, _, last = os.environ.get("COMBINED_CRASH_SEEDS", "1-1").rpartition("-")
    return list(range(int(first or 0), int(last) + (1 if first else 0)))


#: Rounds of changes, kills and a completed capture after the first capture.
ROUNDS = int(os.environ.get("COMBINED_CRASH_ROUNDS", "2"))
TERMINAL = {"succeeded", "failed", "needs_auth", "needs_review", "canceled"}


# -- the source ------------------------------------------------------------------------------


def _big(rng: Random) -> str:
    """Empty, short, or (a third of the time) ~4-16 kB of hex: stored out of line (TOASTed)."""
    roll = rng.random()
    if roll < 0.1:
        return ""
    if roll < 0.3:
        return rng.randbytes(rng.randint(2000, 8000)).hex()  # hex: compresses poorly
    return f.text(rng, most=40)


class Dialect:
    """What differs between the servers: types, triggers, statements."""

    name = "postgres"
    key = "integer"
    fixed = ["bigint", "numeric(18,6)", "timestamptz", "bytea"]
    extra = ["jsonb", "integer[]", "text[]", "boolean", "double precision", "date", "uuid"]
    setup = [
        "CREATE SEQUENCE hc_seq",
        "CREATE TABLE hc_touched (id integer)",
        "CREATE FUNCTION hc_bump() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN NEW.seq := nextval('hc_seq'); RETURN NEW; END $$",
        "CREATE FUNCTION hc_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF TG_OP <> 'INSERT' THEN INSERT INTO hc_touched VALUES (OLD.id); END IF;"
        " IF TG_OP <> 'DELETE' THEN INSERT INTO hc_touched VALUES (NEW.id); END IF;"
        " RETURN NULL; END $$",
        "CREATE TRIGGER hc_bump BEFORE INSERT OR UPDATE ON items"
        " FOR EACH ROW EXECUTE FUNCTION hc_bump()",
        "CREATE TRIGGER hc_touch AFTER INSERT OR UPDATE OR DELETE ON items"
        " FOR EACH ROW EXECUTE FUNCTION hc_touch()",
    ]

    def __init__(self, server: Any) -> None:
        self.server = server

    def kinds(self) -> dict[str, Kind]:
        return {k.ddl: k for k in all_kinds()}

    def text(self) -> Kind:
        return Kind("text", lambda r: quote(_big(r)), f.same, f.same)

    def insert(self, sql: str) -> str:
        return sql + " ON CONFLICT DO NOTHING"

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self.server.conn.execute(sql))


class Maria(Dialect):
    name = "mariadb"
    key = "int"
    fixed = ["bigint", "decimal(18,4)", "datetime(6)", "blob"]
    extra = ["json", "double", "date", "tinyint(1)", "varbinary(32)", "mediumtext"]
    setup = [
        "CREATE SEQUENCE hc_seq",
        "CREATE TABLE hc_touched (id int)",
        "CREATE TRIGGER hc_bump_i BEFORE INSERT ON items FOR EACH ROW"
        " SET NEW.seq = NEXTVAL(hc_seq)",
        "CREATE TRIGGER hc_bump_u BEFORE UPDATE ON items FOR EACH ROW"
        " SET NEW.seq = NEXTVAL(hc_seq)",
        "CREATE TRIGGER hc_touch_i AFTER INSERT ON items FOR EACH ROW"
        " INSERT INTO hc_touched VALUES (NEW.id)",
        "CREATE TRIGGER hc_touch_u AFTER UPDATE ON items FOR EACH ROW"
        " INSERT INTO hc_touched VALUES (OLD.id), (NEW.id)",
        "CREATE TRIGGER hc_touch_d AFTER DELETE ON items FOR EACH ROW"
        " INSERT INTO hc_touched VALUES (OLD.id)",
    ]

    def kinds(self) -> dict[str, Kind]:
        from tests.engine._fidelity_maria import kinds

        return {k.ddl: k for k in kinds()}

    def text(self) -> Kind:
        from tests.engine._fidelity_maria import utf8

        return Kind("longtext", lambda r: utf8(_big(r)), f.same, f.same)

    def insert(self, sql: str) -> str:
        return sql.replace("INSERT INTO", "INSERT IGNORE INTO", 1)

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        with self.server.conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(int(v) for v in row) for row in cur.fetchall()]


class Source:
    """The seed's table, its random changes and what they touched."""

    def __init__(self, dialect: Dialect, rng: Random) -> None:
        self.dialect, self.db, self.rng = dialect, dialect.server, rng
        kinds = dialect.kinds()
        columns: list[tuple[str, Kind]] = [("id", kinds[dialect.key])]
        columns += [(f"c{i}", kinds[ddl]) for i, ddl in enumerate(dialect.fixed)]
        columns.append(("t", dialect.text()))
        for i, ddl in enumerate(rng.sample(dialect.extra, rng.randint(0, 3))):
            columns.append((f"x{i}", kinds[ddl]))
        columns.append(("seq", kinds["bigint"]))
        self.shape = Shape("items", columns, ["id"])
        self.space = 0
        self.truncated: set[int] = set()  # ids a TRUNCATE removed (no row trigger sees them)
        self.lock = threading.Lock()

    def create(self, rows: int) -> None:
        ident = self.db.ident
        cols = ", ".join(
            f"{ident(n)} {k.ddl}" + (" PRIMARY KEY" if n == "id" else "")
            for n, k in self.shape.columns
        )
        self._ok([f"CREATE TABLE items ({cols})", *self.dialect.setup])
        self.space = rows * 2
        for start in range(0, rows, 500):
            values = [self._row(i) for i in range(start + 1, min(rows, start + 500) + 1)]
            self._ok([self._insert(values)])

    def _ok(self, statements: list[str]) -> None:
        errors = self.db.run(statements, transaction=False)
        assert not errors, errors

    def _row(self, key: int) -> list[str]:
        out = []
        for name, kind in self.shape.columns:
            if name == "id":
                out.append(str(key))
            elif name == "seq":
                out.append("0")
            else:
                out.append(self._value(kind))
        return out

    def _value(self, kind: Kind) -> str:
        return "NULL" if self.rng.random() < 0.25 else kind.draw(self.rng)

    def _insert(self, rows: list[list[str]]) -> str:
        names = ", ".join(self.db.ident(n) for n in self.shape.names)
        values = ", ".join(f"({', '.join(r)})" for r in rows)
        return f"INSERT INTO items ({names}) VALUES {values}"

    def ids(self) -> list[int]:
        return [r[0] for r in self.dialect.fetch("SELECT id FROM items ORDER BY id")]

    def change(self) -> None:
        """One round of random statements, some in one transaction; now and then a TRUNCATE."""
        with self.lock:
            rng, ids = self.rng, self.ids()
            if rng.random() < 0.08:
                self.truncated.update(ids)
                self._ok(["TRUNCATE TABLE items"])
                ids = []
            statements = [self._statement(ids) for _ in range(rng.randint(3, 40))]
            self.db.run(statements, transaction=rng.random() < 0.4)  # a key move may collide

    def _statement(self, ids: list[int]) -> str:
        rng, ident = self.rng, self.db.ident
        roll = rng.random()
        fresh = rng.randint(1, self.space)
        if roll < 0.25 or not ids:
            many = [self._row(k) for k in {fresh, *rng.sample(range(1, self.space), 3)}]
            return self.dialect.insert(self._insert(many[: rng.randint(1, len(many))]))
        key = rng.choice(ids)
        if roll < 0.65:
            payload = [(n, k) for n, k in self.shape.columns if n not in ("id", "seq")]
            chosen = rng.sample(payload, rng.randint(1, 3))
            if rng.random() < 0.2:  # many rows at once, the out-of-line text left alone
                chosen = [(n, k) for n, k in chosen if n != "t"] or [payload[0]]
                sets = ", ".join(f"{ident(n)} = {self._value(k)}" for n, k in chosen)
                return f"UPDATE items SET {sets} WHERE id % {rng.randint(2, 9)} = 0"
            sets = ", ".join(f"{ident(n)} = {self._value(k)}" for n, k in chosen)
            return f"UPDATE items SET {sets} WHERE id = {key}"
        if roll < 0.8:
            return f"UPDATE items SET id = {fresh} WHERE id = {key}"
        if roll < 0.83:
            return f"DELETE FROM items WHERE id % {rng.randint(5, 20)} = 1"
        return f"DELETE FROM items WHERE id = {key}"

    def rows(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self.db.rows(self.shape)
        return rows

    def touched(self) -> set[int]:
        found = {r[0] for r in self.dialect.fetch("SELECT DISTINCT id FROM hc_touched")}
        return found | self.truncated


# -- the project and its processes ---------------------------------------------------------------


def _project(root: Path, connector: str, dsn: str, history: frozenset[str], lake: str) -> None:
    """Source ``ps``: a snapshot and a cursor dataset; ``pc``: a cdc one (its own Runs).

    The datasets named in ``history`` keep every version of every row (``history: true``);
    ``lake``: where the lake is (a directory of the project, or an object store's URI).
    """
    cursor = "{column: seq, trust: 'set by a trigger'}"
    slots = f"      slot_prefix: {dsn.rsplit('/', 1)[1]}\n" if connector == "postgres" else ""
    kept = {name: ", history: true" if name in history else "" for name in DATASETS}
    (root / "combined.yaml").write_text(
        f"version: 1\nlake: {lake}\nsources:\n"
        f"  ps:\n    connector: {connector}\n    config:\n      dsn: {dsn}\n    datasets:\n"
        f"      s_items: {{relation: items, key: [id]{kept['ps.s_items']}}}\n"
        f"      u_items: {{relation: items, key: [id], strategy: cursor, cursor: {cursor}"
        f"{kept['ps.u_items']}}}\n"
        f"  pc:\n    connector: {connector}\n    config:\n      dsn: {dsn}\n{slots}"
        f"    datasets:\n      c_items: {{relation: items, key: [id], strategy: cdc"
        f"{kept['pc.c_items']}}}\n"
    )


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from combined.cli import main; main()", *args]


def _env() -> dict[str, str]:
    """The processes' environment: this one's as it is now (an object store's set by a fixture)."""
    return {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}


def _complete(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``combined ARGS`` run to its end: status 0, or 5 for the cursor's deletes alone."""
    done = subprocess.run(
        _argv(*args), cwd=root, env=_env(), capture_output=True, text=True, timeout=300
    )
    said = f"combined {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    # A cursor sees no delete: reconciliation says so (status 5); nothing else may disagree.
    told = [line for line in done.stderr.splitlines() if line.startswith("reconciliation")]
    cursor = all("ps.u_items" in line and "a cursor cannot see deletes" in line for line in told)
    assert done.returncode == 0 or (done.returncode == 5 and told and cursor), said
    assert not re.search(r"^run \S+ failed", done.stdout, re.M), said
    return done


def _killed(root: Path, args: list[str], delay: float) -> int:
    """Start ``combined ARGS``, SIGKILL it after ``delay`` seconds; its return code."""
    child = subprocess.Popen(
        _argv(*args), cwd=root, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        return child.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
        return child.wait()


# -- what the lake must hold ---------------------------------------------------------------------


DATASETS = ("ps.s_items", "ps.u_items", "pc.c_items")


class Expected:
    """The rows each dataset must publish and the identities MAR may bill."""

    def __init__(self, history: frozenset[str]) -> None:
        self.history = history  # the datasets with ``history: true``
        self.source: dict[int, tuple[Any, ...]] = {}
        self.cursor: dict[int, tuple[Any, ...]] = {}
        self.changed: dict[str, set[int]] = {d: set() for d in DATASETS}
        self.loose = False  # a change ran beside a killed capture: deleted rows' last values vary

    def captured(self, rows: list[tuple[Any, ...]]) -> None:
        now = {r[0]: r for r in rows}
        moved = {k for k in now.keys() | self.source.keys() if now.get(k) != self.source.get(k)}
        self.changed["ps.s_items"] |= moved
        self.changed["pc.c_items"] |= moved
        self.changed["ps.u_items"] |= {k for k, r in now.items() if self.cursor.get(k) != r}
        self.cursor.update(now)
        self.source = now


def _rows(engine: Engine, src: Source, expected: Expected, touched: set[int]) -> list[str]:
    """Each dataset's published rows against the source's, each identity once."""
    problems = []
    for name in DATASETS:
        table = engine.sql(f"SELECT * FROM {name}")
        ids = engine.sql(f"SELECT count(*) - count(DISTINCT _combined_id) AS d FROM {name}")
        if repeated := ids.column("d")[0].as_py():
            problems.append(f"{name}: {repeated} identities held twice")
        rows = f.lake_rows(table, src.shape.kinds, src.shape.names)
        want = expected.source
        if name == "ps.u_items":
            want = expected.cursor
            if expected.loose:
                # A killed read beside the changes saw rows between statements: the
                # rows gone from the source may hold any value a statement gave them.
                want = {k: v for k, v in want.items() if k in expected.source}
                if strays := {r[0] for r in rows if r[0] not in want} - touched:
                    problems.append(f"{name}: rows no statement touched: {sorted(strays)}")
                rows = [r for r in rows if r[0] in expected.source]
        if diff := f.differences(list(want.values()), rows):
            problems.append(f"{name}: {diff}")
    return problems


def _usage(engine: Engine, expected: Expected, touched: set[int]) -> list[str]:
    """MAR shown is MAR recounted, each pair billed once, between changed and touched."""
    from combined.usage import month_counts

    problems = []
    month = datetime.now(UTC).strftime("%Y-%m")
    billed = {(u["source"], u["dataset"]): u for u in engine.usage(month)}
    for name in DATASETS:
        source, dataset = name.split(".")
        shown = billed.get((source, dataset))
        counted = month_counts(engine.layout, source, dataset, month)
        if shown is None or {k: shown[k] for k in counted} != counted:
            problems.append(f"{name}: MAR shown {shown}, recounted {counted}")
        usage = engine.layout.usage_table(source, dataset)
        if usage.exists() and (dup := _usage_repeats(engine, (source, dataset), usage)):
            problems.append(f"{name}: {dup} (month, identity, operation) billed twice")
        lo, hi = len(expected.changed[name]), len(touched)
        exact = name == "ps.u_items" and not expected.loose
        if not lo <= counted["mar"] <= hi or (exact and counted["mar"] != lo):
            problems.append(f"{name}: MAR {counted['mar']}, changed {lo}, touched {hi}")
    return problems


def _history(engine: Engine, history: frozenset[str]) -> list[str]:
    """A history's current versions are the table's rows; each id's versions follow each other."""
    problems = []
    for name in sorted(history):
        h = f"{name}__history"
        pairs = "SELECT _combined_id, _combined_payload_hash FROM {}"
        now = pairs.format(name)
        current = pairs.format(h) + " WHERE _combined_is_current"
        differ = engine.sql(
            f"SELECT (SELECT count(*) FROM ({current} EXCEPT ALL {now})) AS extra, "
            f"(SELECT count(*) FROM ({now} EXCEPT ALL {current})) AS missing"
        ).to_pylist()[0]
        if differ["extra"] or differ["missing"]:
            problems.append(f"{h}: current versions against the table's rows: {differ}")
        versions = (
            "SELECT _combined_valid_from AS f, _combined_valid_to AS t, _combined_is_current AS c, "
            "lead(_combined_valid_from) OVER (PARTITION BY _combined_id "
            f"ORDER BY _combined_valid_from) AS nf FROM {h}"
        )
        wrong = "(t IS NULL) <> c OR t <= f OR (nf IS NOT NULL AND (t IS NULL OR t > nf))"
        found = engine.sql(f"SELECT count(*) AS n FROM ({versions}) WHERE {wrong}")
        (broken,) = found.column("n").to_pylist()
        if broken:
            problems.append(f"{h}: {broken} versions open twice, overlapping or ending early")
    return problems


def _commits(engine: Engine, root: Path) -> list[str]:
    """Deliveries 1..n, the catalog's last the lake's, files once; Runs ended; staging empty."""
    from combined.catalog import data as cat

    problems = []
    for name in DATASETS:
        source, dataset = name.split(".")
        lake = engine.layout.dataset_table(source, dataset)
        files = lake.files()
        if len(files) != len(set(files)):
            problems.append(f"{name}: a data file listed twice in one version")
        with engine.catalog.begin() as conn:
            committed = cat.deliveries(conn, source=source, dataset=dataset, states=["committed"])
            last = cat.get_dataset(conn, source, dataset).last_sequence
        seqs = [d.sequence for d in committed]
        if seqs != list(range(1, len(seqs) + 1)) or last != lake.committed_sequence():
            problems.append(
                f"{name}: committed sequences {seqs}, catalog's last {last}, "
                f"lake's {lake.committed_sequence()}"
            )
    if unended := [(r.id, r.state) for r in engine.runs(1000) if r.state not in TERMINAL]:
        problems.append(f"runs not ended: {unended}")
    staging = engine.layout.staging_area()
    if left := sorted(p.name for p in staging.iterdir()) if staging.exists() else []:
        problems.append(f"staging holds {left}")
    return problems


def _check(root: Path, seed: int, step: str, src: Source, expected: Expected) -> None:
    touched = src.touched()
    engine = Engine.open(root / "combined.yaml")
    try:
        problems = _rows(engine, src, expected, touched)
        problems += _history(engine, expected.history)
        problems += _usage(engine, expected, touched)
        problems += _commits(engine, root)
    finally:
        engine.close()
    loose = " (a change ran beside a killed capture)" if expected.loose else ""
    assert not problems, f"seed {seed}, after {step}{loose}:\n" + "\n".join(problems)


def _usage_repeats(engine: Engine, key: tuple[str, str], usage: LakeTable) -> int:
    """The (month, identity, operation) billed more than once (in any store).

    A reference to a Delivery stands for its rows (``combined.usage._refs``).
    """
    import duckdb

    from combined.protocol._digest import digest_of
    from combined.usage import _billed
    from combined.usage._refs import referencing

    files, schema, store = usage.files(), usage.schema(), engine.layout.store
    con = duckdb.connect()
    try:
        months = con.execute(f"SELECT DISTINCT month FROM {store.duck_source(con, files)}")
        n = 0
        for (month,) in months.fetchall():
            billed = _billed(
                con, engine.layout, key, files, month, digest_of(schema), referencing(schema)
            )
            (more,) = con.execute(
                f"SELECT count(*) - count(DISTINCT (month, _combined_id, op)) FROM ({billed})"
            ).fetchone() or (0,)
            n += int(more)
    finally:
        con.close()
    return n


def _barrier(dsn: str, root: Path, seed: int, step: str) -> None:
    """The slot never confirms past where the lake's next read resumes (MariaDB keeps none).

    That is the newest cdc commit's checkpoint, or the position idle captures
    kept after it (``lake._positions``: they read no change of the dataset).
    """
    import psycopg

    if not dsn.startswith("postgresql"):
        return

    engine = Engine.open(root / "combined.yaml")
    try:
        lake = engine.layout.dataset_table("pc", "c_items")
        checkpoint = engine.committed_checkpoint("pc", "c_items") if lake.exists() else None
    finally:
        engine.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        slots = conn.execute(
            "SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots "
            "WHERE database = current_database()"
        ).fetchall()
        if checkpoint is None or not slots:
            return
        lsn = checkpoint["lsn"]
        ((ahead,),) = conn.execute(
            "SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots "
            "WHERE database = current_database()",
            (lsn,),
        ).fetchall()
    assert not ahead, f"seed {seed}, {step}: slot {slots} confirmed past the lake's {lsn}"


def _replays(root: Path, seed: int) -> None:
    engine = Engine.open(root / "combined.yaml")
    try:
        for name in DATASETS:
            result = engine.replay(name)
            assert result.equal, f"seed {seed}: replay of {name}: {result.to_json()}"
    finally:
        engine.close()


# -- the rounds ----------------------------------------------------------------------------------


def _kills(
    root: Path, rng: Random, dsn: str, seed: int, step: str, src: Source, took: float
) -> bool:
    """Zero to two killed processes; True when a change ran beside one."""
    beside = False
    for n in range(rng.choice([0, 1, 1, 1, 2, 2])):
        args = ["capture"]
        if rng.random() < 0.25:
            args = ["cdc", "follow", "pc", "--every", "0.5", "--iterations", str(rng.randint(1, 3))]
            args += ["--max-changes", str(rng.randint(1, 50))] if rng.random() < 0.7 else []
        elif rng.random() < 0.3:
            args = ["capture", rng.choice(DATASETS)]
        changer = None
        if rng.random() < 0.2:
            beside = True
            changer = threading.Timer(rng.uniform(0, took), src.change)
            changer.start()
        delay = rng.uniform(0.05, took * 1.2)
        _killed(root, args, delay)
        if changer is not None:
            changer.join()
        _barrier(dsn, root, seed, f"{step}, kill {n + 1} ({' '.join(args)} at {delay:.2f} s)")
    return beside


def _rounds(seed: int, root: Path, src: Source, dsn: str, lake: str = "./lake") -> None:
    rng = src.rng
    src.create(rng.choice([50, 400, 1000, 2000, 4000]))
    # (drawn apart: the seed's statements and kills stay those it drew before)
    kept = Random(f"history {seed}")
    expected = Expected(frozenset(d for d in DATASETS if kept.random() < 0.5))
    _project(root, src.dialect.name, dsn, expected.history, lake)
    began = time.monotonic()
    if rng.random() < 0.5:  # the first capture killed too
        expected.loose |= _kills(root, rng, dsn, seed, "the first capture", src, 2.5)
    _complete(root, "capture")
    took = max(time.monotonic() - began, 1.0)
    expected.captured(src.rows())
    _check(root, seed, "the first capture", src, expected)
    for step in range(1, ROUNDS + 1):
        src.change()
        expected.loose |= _kills(root, rng, dsn, seed, f"round {step}", src, took)
        if rng.random() < 0.3:
            _complete(root, "repair")
        _complete(root, "capture")
        expected.captured(src.rows())
        _check(root, seed, f"round {step}", src, expected)
    _replays(root, seed)


#: Where a seed's lake is: on disk, or in a bucket of the S3 server on 127.0.0.1,
#: where a kill may land mid-upload, between a Delivery's upload and its
#: commit, or in a conditional write of the Delta log (beside the parallel
#: suite: it mostly waits on the server and the kills).
LAKES = pytest.mark.parametrize("lake", ["local", pytest.param("s3", marks=pytest.mark.beside)])


def _lake(lake: str, request: pytest.FixtureRequest) -> str:
    """The project's ``lake:`` for ``lake`` (the S3 one in a bucket of its own)."""
    return "./lake" if lake == "local" else f"s3://{request.getfixturevalue('s3_bucket')}/lake"


@pytest.mark.postgres
@pytest.mark.parametrize("seed", seeds())
@LAKES
def test_random_kills_of_postgres_captures_lose_and_repeat_nothing(
    seed: int, lake: str, pg_server_dsn: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with fresh_database(pg_server_dsn, "hcrash") as dsn:  # dropped with its slot
        pg = Postgres(dsn)
        try:
            source = Source(Dialect(pg), Random(seed))
            _rounds(seed, tmp_path, source, dsn, _lake(lake, request))
        finally:
            pg.close()


@pytest.mark.mariadb
@pytest.mark.parametrize("seed", seeds())
@LAKES
def test_random_kills_of_mariadb_captures_lose_and_repeat_nothing(
    seed: int, lake: str, mariadb_server_dsn: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from tests.engine._fidelity_maria import MariaDB
    from tests.engine._fidelity_maria import fresh_database as fresh_maria

    with fresh_maria(mariadb_server_dsn, "hcrash") as (dsn, kwargs):
        db = MariaDB(kwargs)
        try:
            _rounds(seed, tmp_path, Source(Maria(db), Random(seed)), dsn, _lake(lake, request))
        finally:
            db.close()
