"""CDC figures (issue 5): backlog throughput and follow-mode latency.

``python -m bench.cdc [--changes N] [--samples M]`` against a real PostgreSQL
with ``wal_level=logical``:

1. **backlog**: a stitched first capture of an empty table, then N changes
   (60% inserts, 30% updates, 10% deletes, in transactions of 10,000) committed
   while nothing reads the slot; one ``combined capture`` in a fresh process
   drains them into the lake. Reported: changes/s, CPU-seconds, peak RSS, and
   that the lake equals the source.
2. **single-row transactions** (issue 25): the same backlog of ``--txns``
   changes, each committed alone (a procedure committing after each row), as
   a busy OLTP source makes them.
3. **wide backlog** (issue 25): a wide table (numeric(14,4), text[] with
   NULL elements, jsonb, uuid, date, timestamptz, every 20th row a 2-4 KB
   text stored out of line) of ``--wide-rows`` rows is captured first; then
   every row is updated beside its out-of-line text (pgoutput marks it
   unchanged) and one capture drains the backlog at the default settings.
   Reported: changes/s, CPU-seconds, peak RSS, and that the lake equals the
   source (the out-of-line text compared by its md5).
4. **latency**: ``combined cdc follow --every 0.5`` runs in a fresh process
   while M single-row transactions commit 200 ms apart; each row's latency is
   the time from its source commit to the first publication whose basis holds
   it. Reported: p50 and p95.

Wall times on a shared machine are noisy: read the figures as orders of
magnitude and compare runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.measure import timed_child

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      events:
        relation: public.events
        key: [id]
        strategy: cdc
"""


def _cli(root: Path, *args: str) -> tuple[int, float, float, str]:
    """Run the CLI in a child; return exit code, wall seconds, peak RSS MB, stderr tail."""
    rc, wall, rss, _, err = _cli_cpu(root, *args)
    return rc, wall, rss, err


def _cli_cpu(root: Path, *args: str) -> tuple[int, float, float, float, str]:
    """:func:`_cli`, with the child's CPU-seconds (user + system) before the stderr tail."""
    argv = ["-c", "from combined.cli import main; main()", *args]
    rc, wall, rss, cpu, _, err = timed_child(argv, cwd=root)
    return rc, wall, rss, cpu, err


def _database(server: str) -> tuple[str, str]:
    import psycopg

    name = f"combined_cdc_bench_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, server.rsplit("/", 1)[0] + f"/{name}"


def _drop(server: str, name: str, dsn: str, prefix: str) -> None:
    import psycopg

    from combined.connectors.postgres._connect import Settings
    from combined.connectors.postgres._publication import drop_publication
    from combined.connectors.postgres._replication import drop_slot
    from combined.connectors.postgres._stitch import slot_name

    slot = slot_name(prefix, "public.events")
    drop_slot(Settings(dsn), slot)
    drop_publication(Settings(dsn), slot)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _setup(dsn: str, root: Path, prefix: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE events (id bigint PRIMARY KEY, kind text, amount numeric(12,2), "
            "at timestamptz DEFAULT clock_timestamp())"
        )
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, prefix=prefix))
    rc, _, _, err = _cli(root, "cdc", "setup", "pg")
    if rc != 0:
        raise SystemExit(f"cdc setup failed: {err}")


#: The backlog's changes, each its own transaction (what a busy OLTP source makes).
ONE_BY_ONE = """\
CREATE PROCEDURE one_by_one(inserts bigint, updates bigint, deletes bigint)
LANGUAGE plpgsql AS $$
BEGIN
  FOR g IN 1..inserts LOOP
    INSERT INTO events (id, kind, amount) VALUES (g, 'k' || (g % 7), g * 0.5); COMMIT;
  END LOOP;
  FOR g IN 1..updates LOOP UPDATE events SET amount = amount + 1 WHERE id = g; COMMIT; END LOOP;
  FOR g IN inserts - deletes + 1..inserts LOOP DELETE FROM events WHERE id = g; COMMIT; END LOOP;
END $$"""


def backlog(server: str, changes: int, *, single: bool = False) -> dict[str, Any]:
    """Drain a backlog of ``changes`` changes with one capture (``single``: each change
    its own transaction, else transactions of 10,000)."""
    import psycopg

    name, dsn = _database(server)
    prefix = f"cb_{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    try:
        _setup(dsn, root, prefix)
        inserts, updates, deletes = int(changes * 0.6), int(changes * 0.3), int(changes * 0.1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if single:
                conn.execute(ONE_BY_ONE)
                conn.execute("CALL one_by_one(%s, %s, %s)", (inserts, updates, deletes))
            for lo in range(0, 0 if single else inserts, 10_000):
                conn.execute(
                    "INSERT INTO events (id, kind, amount) SELECT g, 'k' || (g %% 7), g * 0.5 "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (lo + 1, min(lo + 10_000, inserts)),
                )
            for lo in range(0, 0 if single else updates, 10_000):
                conn.execute(
                    "UPDATE events SET amount = amount + 1 "
                    "WHERE id > %s::bigint AND id <= %s::bigint",
                    (lo, min(lo + 10_000, updates)),
                )
            if not single:
                conn.execute("DELETE FROM events WHERE id > %s", (inserts - deletes,))
        rc, wall, rss, cpu, err = _cli_cpu(root, "capture")
        if rc != 0:
            raise SystemExit(f"capture failed: {err}")
        from combined.engine import Engine

        engine = Engine.open(root / "combined.yaml")
        try:
            lake = engine.sql("SELECT count(*) AS n, sum(amount) AS s FROM pg.events").to_pylist()
        finally:
            engine.close()
        with psycopg.connect(dsn) as conn:
            src = conn.execute("SELECT count(*), sum(amount) FROM events").fetchone()
        assert src is not None
        equal = lake[0]["n"] == src[0] and lake[0]["s"] == src[1]
        return {
            "changes": inserts + updates + deletes,
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "changes_per_s": round((inserts + updates + deletes) / wall),
            "changes_per_cpu_s": round((inserts + updates + deletes) / cpu),
            "peak_rss_mb": round(rss),
            "lake_equals_source": equal,
        }
    finally:
        _drop(server, name, dsn, prefix)
        shutil.rmtree(root, ignore_errors=True)  # (the project, its lake and staging)


WIDE = """\
CREATE TABLE events (id bigint PRIMARY KEY, amount numeric(14,4), tags text[], doc jsonb,
  uid uuid, d date, ts timestamptz, n int, body text);
ALTER TABLE events ALTER COLUMN body SET STORAGE EXTERNAL"""

#: Every 20th row holds a 2-4 KB text, stored out of line (EXTERNAL: never inline).
WIDE_ROWS = """\
INSERT INTO events SELECT g, (g * 1.2345)::numeric(14,4), ARRAY['a' || g, NULL, 'b'],
  jsonb_build_object('k', g, 'v', 'x' || g, 'l', jsonb_build_array(1, 2, g)),
  md5(g::text)::uuid, date '2020-01-01' + (g %% 1000)::int,
  timestamptz '2024-01-01' + g * interval '1 second', 0,
  CASE WHEN g %% 20 = 0
    THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 64 + g %% 64) i)
    ELSE 'short ' || g END
FROM generate_series(%s::bigint, %s::bigint) g"""


def wide_backlog(server: str, rows: int) -> dict[str, Any]:
    """Drain a backlog of updates that leave each wide row's out-of-line text unchanged."""
    import psycopg

    name, dsn = _database(server)
    prefix = f"cw_{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="cdc-wide-"))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(WIDE)
            for lo in range(0, rows, 50_000):
                conn.execute(WIDE_ROWS, (lo + 1, min(lo + 50_000, rows)))
        (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, prefix=prefix))
        for step in (("cdc", "setup", "pg"), ("capture",)):  # the stitched snapshot
            rc, _, _, err = _cli(root, *step)
            if rc != 0:
                raise SystemExit(f"{' '.join(step)} failed: {err}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for lo in range(0, rows, 50_000):
                conn.execute(
                    "UPDATE events SET n = n + 1 WHERE id > %s AND id <= %s",
                    (lo, min(lo + 50_000, rows)),
                )
        rc, wall, rss, cpu, err = _cli_cpu(root, "capture")
        if rc != 0:
            raise SystemExit(f"capture failed: {err}")
        from combined.engine import Engine

        check = "SELECT count(*) AS n, sum(n) AS s, count(DISTINCT md5(body)) AS b"
        engine = Engine.open(root / "combined.yaml")
        try:
            lake = engine.sql(f"{check}, sum(length(body)) AS l FROM pg.events").to_pylist()[0]
        finally:
            engine.close()
        with psycopg.connect(dsn) as conn:
            src = conn.execute(f"{check}, sum(length(body)) AS l FROM events").fetchone()
        assert src is not None
        return {
            "changes": rows,
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "changes_per_s": round(rows / wall),
            "changes_per_cpu_s": round(rows / cpu),
            "peak_rss_mb": round(rss),
            "lake_equals_source": tuple(lake.values()) == tuple(src),
        }
    finally:
        _drop(server, name, dsn, prefix)
        shutil.rmtree(root, ignore_errors=True)  # (the project, its lake and staging)


def latency_summary(
    seen: dict[int, datetime], committed: dict[int, datetime], samples: int
) -> dict[str, Any]:
    """p50/p95/max of commit-to-publication latency of the ``committed`` samples ``seen``."""
    lat = sorted((seen[i] - committed[i]).total_seconds() for i in committed if i in seen)
    if not lat:
        raise SystemExit("no sample was published")
    return {
        "samples": len(lat),
        "p50_s": round(statistics.median(lat), 2),
        "p95_s": round(lat[max(0, int(len(lat) * 0.95) - 1)], 2),
        "max_s": round(lat[-1], 2),
        "missing": samples - len(lat),
    }


def latency(server: str, samples: int) -> dict[str, Any]:
    """Source commit to publication, in follow mode."""
    import psycopg

    from combined.engine import Engine

    name, dsn = _database(server)
    prefix = f"cl_{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="cdc-latency-"))
    try:
        _setup(dsn, root, prefix)
        follow = subprocess.Popen(
            [
                sys.executable, "-c", "from combined.cli import main; main()",
                "cdc", "follow", "pg", "--every", "0.5",
                "--iterations", str(int(samples * 0.2 / 0.5) + 40),
            ],
            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        committed: dict[int, datetime] = {}
        time.sleep(2.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(1, samples + 1):
                conn.execute("INSERT INTO events (id, kind, amount) VALUES (%s, 'x', 1)", (i,))
                committed[i] = datetime.now(UTC)
                time.sleep(0.2)
        follow.wait(timeout=600)
        engine = Engine.open(root / "combined.yaml")
        seen: dict[int, datetime] = {}
        try:
            for pub in reversed(engine.publications(limit=100_000)):
                ids = (
                    engine.sql("SELECT id FROM pg.events", publication=pub["id"])
                    .column("id")
                    .to_pylist()
                )
                for i in ids:
                    seen.setdefault(int(i), pub["published_at"])
        finally:
            engine.close()
        return latency_summary(seen, committed, samples)
    finally:
        _drop(server, name, dsn, prefix)
        shutil.rmtree(root, ignore_errors=True)  # (the project, its lake and staging)


def main(argv: list[str] | None = None) -> None:
    """Run both measurements and print them as JSON and a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=500_000)
    parser.add_argument("--txns", type=int, default=200_000, help="single-row transactions")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--wide-rows", type=int, default=500_000)
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "COMBINED_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args(argv)
    b = backlog(args.dsn, args.changes)
    t = backlog(args.dsn, args.txns, single=True)
    w = wide_backlog(args.dsn, args.wide_rows)
    lat = latency(args.dsn, args.samples)
    print(json.dumps({"backlog": b, "txn_backlog": t, "wide_backlog": w, "latency": lat}, indent=2))
    print()
    print("| measure | figure |")
    print("|---|---:|")
    print(f"| backlog of {b['changes']:,} changes drained by one capture | {b['wall_s']} s |")
    print(f"| backlog throughput | {b['changes_per_s']:,} changes/s, {b['cpu_s']} CPU-s |")
    print(f"| backlog throughput per CPU-second | {b['changes_per_cpu_s']:,} changes |")
    print(f"| backlog capture peak RSS | {b['peak_rss_mb']} MB |")
    print(f"| lake equals source after the backlog | {b['lake_equals_source']} |")
    print(
        f"| backlog of {t['changes']:,} single-row transactions | {t['wall_s']} s, "
        f"{t['cpu_s']} CPU-s, {t['peak_rss_mb']} MB |"
    )
    print(f"| single-row transactions' throughput | {t['changes_per_s']:,} changes/s |")
    print(f"| ... per CPU-second | {t['changes_per_cpu_s']:,} changes |")
    print(f"| lake equals source after them | {t['lake_equals_source']} |")
    print(
        f"| wide backlog of {w['changes']:,} TOAST-unchanged updates | {w['wall_s']} s, "
        f"{w['cpu_s']} CPU-s |"
    )
    print(f"| wide backlog throughput | {w['changes_per_s']:,} changes/s |")
    print(f"| wide backlog throughput per CPU-second | {w['changes_per_cpu_s']:,} changes |")
    print(f"| wide backlog capture peak RSS | {w['peak_rss_mb']} MB |")
    print(f"| lake equals source after the wide backlog | {w['lake_equals_source']} |")
    print(f"| follow mode, commit to publication, p50 ({lat['samples']} rows) | {lat['p50_s']} s |")
    print(f"| follow mode, commit to publication, p95 | {lat['p95_s']} s |")


if __name__ == "__main__":
    main()
