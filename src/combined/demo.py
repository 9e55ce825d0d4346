"""``combined demo``: a sample SQLite shop captured, changed, captured again, queried."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from combined.errors import ConfigError

if TYPE_CHECKING:
    from combined.engine import Engine

DEMO_PROJECT = """\
# A demo project: a SQLite shop captured into ./lake.
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
    datasets:
      customers:
        key: [id]
        strategy: snapshot
        sync_mode: incremental
      orders:
        key: [id]
        strategy: snapshot
        sync_mode: incremental
      events:
        key: [id]
        strategy: cursor
        sync_mode: append
        cursor:
          column: id
          trust: "events.id is an INTEGER PRIMARY KEY assigned in increasing order"
"""


def build_shop(path: Path) -> None:
    """A sample SQLite shop at ``path``: customers, orders and events (the demo's source)."""
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL,
                             status TEXT NOT NULL, total REAL NOT NULL);
        CREATE TABLE events (id INTEGER PRIMARY KEY, order_id INTEGER, kind TEXT);
        """
    )
    cities = ["Lyon", "Porto", "Turin", "Ghent", "Malmo"]
    con.executemany(
        "INSERT INTO customers VALUES (?, ?, ?)",
        [(i, f"customer {i}", cities[i % 5]) for i in range(1, 51)],
    )
    con.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?)",
        [(i, 1 + i % 50, "placed", round(10 + i * 1.25, 2)) for i in range(1, 1001)],
    )
    con.executemany(
        "INSERT INTO events (order_id, kind) VALUES (?, ?)", [(i, "placed") for i in range(1, 1001)]
    )
    con.commit()
    con.close()


def _change_shop(path: Path) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        """
        UPDATE orders SET status = 'shipped' WHERE id <= 20;
        DELETE FROM orders WHERE id BETWEEN 995 AND 1000;
        INSERT INTO orders VALUES (1001, 7, 'placed', 99.5), (1002, 8, 'placed', 12.0);
        UPDATE customers SET city = 'Bergen' WHERE id = 3;
        INSERT INTO events (order_id, kind) SELECT id, 'shipped' FROM orders WHERE id <= 20;
        """
    )
    con.commit()
    con.close()


# Written first into the demo directory: a later demo replaces only a
# directory holding it (or an empty one), never a directory it did not make.
MARKER = ".combined-demo"
MARKER_TEXT = "made by `combined demo`: the next `combined demo` here replaces this directory\n"


def _older_demo(directory: Path) -> bool:
    """A demo directory made before the marker: its project file is the demo's, unchanged."""
    project = directory / "combined.yaml"
    try:
        return project.is_file() and project.read_text() == DEMO_PROJECT
    except (OSError, UnicodeDecodeError):
        return False


def _prepare(directory: Path) -> None:
    """Make ``directory`` an empty demo directory, replacing only an earlier demo's."""
    try:
        if directory.is_dir():
            if (directory / MARKER).is_file() or _older_demo(directory):
                for entry in directory.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            elif any(directory.iterdir()):
                raise ConfigError(
                    f"{directory} already exists and was not made by `combined demo`",
                    hint="pick another directory with --directory, or remove it yourself",
                )
        elif directory.exists():
            raise ConfigError(
                f"{directory} already exists and is not a directory",
                hint="pick another directory with --directory, or remove it yourself",
            )
        directory.mkdir(parents=True, exist_ok=True)
        (directory / MARKER).write_text(MARKER_TEXT)
    except OSError as exc:
        raise ConfigError(
            f"cannot prepare the demo directory {directory}: {exc.strerror or exc}",
            hint="pick a writable directory with --directory",
        ) from exc


def _step(console: Console, title: str, rest: str = "") -> None:
    # ``rest`` may quote a path: a Text is printed as written, never as markup.
    console.print(Text.assemble((title, "bold"), rest))


def _show(console: Console, title: str, rows: Any) -> None:
    table = Table(*rows.column_names, title=title, title_justify="left")
    for row in rows.to_pylist():
        table.add_row(*["" if v is None else str(v) for v in row.values()])
    console.print(table)


def reach_combined() -> str:
    """What to type before ``combined`` is on the PATH: nothing when it already is.

    ``make demo`` installs the command in ``.venv/bin``, which a new shell
    does not search: the hint then starts by activating that environment.
    """
    here = Path(sys.executable).parent
    mine = here / "combined"
    found = shutil.which("combined")
    if found is not None and mine.exists() and os.path.samefile(found, mine):
        return ""
    activate = here / "activate"
    if activate.is_file():
        return f"source {shlex.quote(os.path.relpath(activate))} && "
    return f'export PATH={shlex.quote(str(here))}:"$PATH" && '


def run_demo(directory: Path, console: Console) -> None:
    """Build the demo shop in ``directory`` and walk through two captures."""
    from combined.engine import Engine

    _prepare(directory)
    (directory / "combined.yaml").write_text(DEMO_PROJECT)
    build_shop(directory / "shop.db")
    _step(
        console,
        "1. a sample shop",
        f" in {directory}/shop.db, project file {directory}/combined.yaml",
    )
    engine = Engine.open(directory / "combined.yaml")
    try:
        between = _two_captures(engine, directory, console)
        _show_lake(engine, console, between)
        _show_usage(engine, console)
        console.print(
            Text(
                f"try: {reach_combined()}cd {shlex.quote(str(directory))} && "
                'combined sql "SELECT * FROM shop.customers LIMIT 5"'
            ),
            soft_wrap=True,  # one line, to copy as it is
        )
    finally:
        engine.close()


def _two_captures(engine: Engine, directory: Path, console: Console) -> datetime:
    """Steps 2 to 4: capture, change the shop, capture again; when the first was published."""
    (first,) = engine.capture()
    _step(console, "2. first capture", f": run {first.id} {first.state}")
    for ds, s in (first.stats or {}).items():
        console.print(f"   shop.{ds}: {s['captured']} rows read, {s['inserts']} new")
    between: datetime = engine.publications(1)[0]["published_at"]
    time.sleep(1.1)
    _change_shop(directory / "shop.db")
    _step(
        console,
        "3. the shop changes",
        ": 20 orders shipped, 6 deleted, 2 placed, 1 customer moved, 20 events",
    )
    (second,) = engine.capture()
    _step(console, "4. second capture", f": run {second.id} {second.state}")
    for ds, s in (second.stats or {}).items():
        console.print(
            f"   shop.{ds}: {s['captured']} read -> +{s['inserts']} ~{s['updates']} "
            f"-{s['deletes']} ({s['deliveries']} deliveries)"
        )
    return between


def _show_lake(engine: Engine, console: Console, between: datetime) -> None:
    """Steps 5 to 8: the runs, rows explained, the tables now and as of ``between``."""
    runs = Table("run", "trigger", "state", "publication")
    for r in engine.runs(5):
        runs.add_row(r.id, r.trigger, r.state, r.publication_id or "-")
    _step(console, "5. runs")
    console.print(runs)
    _show(
        console,
        "6. shipped orders, explained row by row (combined sql)",
        engine.sql(
            "SELECT id, status, _combined_op AS op, _combined_run_id AS run, "
            "left(_combined_delivery_id, 12) AS delivery, _combined_ingested_at AS ingested "
            "FROM shop.orders WHERE id IN (1, 2, 1001) ORDER BY id"
        ),
    )
    query = (
        "SELECT count(*) AS orders, count(*) FILTER (WHERE status = 'shipped') AS shipped, "
        "max(id) AS max_id FROM shop.orders"
    )
    _show(console, "7. now", engine.sql(query))
    _show(
        console,
        f"8. as of {between.isoformat(timespec='seconds')} (--as-of): the earlier state",
        engine.sql(query, as_of=between),
    )


def _show_usage(engine: Engine, console: Console) -> None:
    """Step 9: the monthly active rows the two captures billed."""
    usage = Table("dataset", "MAR", "inserts", "updates", "deletes")
    for u in engine.usage():
        usage.add_row(
            f"{u['source']}.{u['dataset']}",
            str(u["mar"]),
            str(u["inserts"]),
            str(u["updates"]),
            str(u["deletes"]),
        )
    _step(console, "9. monthly active rows")
    console.print(usage)
