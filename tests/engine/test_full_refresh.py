"""full_refresh replaces the projection, including with nothing and with a new column."""

from __future__ import annotations

from pathlib import Path

from combined.engine import Engine


def _project(root: Path, tools) -> Path:
    tools.make(root)
    path = root / "combined.yaml"
    path.write_text(
        path.read_text().replace(
            "      orders:\n        key: [id]\n",
            "      orders:\n        key: [id]\n        sync_mode: full_refresh\n",
        )
    )
    return path


def test_an_emptied_source_replaces_the_projection_with_nothing(tmp_path: Path, tools) -> None:
    engine = Engine.open(_project(tmp_path, tools))
    try:
        engine.capture(["shop.orders"])
        tools.sql(tmp_path, "DELETE FROM orders;")
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 0}]
    finally:
        engine.close()


def test_a_new_column_evolves_the_replaced_table(tmp_path: Path, tools) -> None:
    engine = Engine.open(_project(tmp_path, tools))
    try:
        engine.capture(["shop.orders"])
        tools.sql(
            tmp_path,
            "ALTER TABLE orders ADD COLUMN channel TEXT; UPDATE orders SET channel = 'web';",
        )
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT count(*) AS n, count(*) FILTER (WHERE channel = 'web') AS web FROM shop.orders"
        ).to_pylist()
        assert rows == [{"n": 200, "web": 200}]
    finally:
        engine.close()


def _raw_files(root: Path) -> list[Path]:
    return sorted((root / "lake" / "_deliveries" / "shop" / "orders").glob("*"))


def test_an_unchanged_replacement_commits_and_stores_nothing(tmp_path: Path, tools) -> None:
    # Replacing the projection with the rows it already holds would write a
    # whole copy of the table into the lake and the raw layer every capture.
    engine = Engine.open(_project(tmp_path, tools))
    try:
        (first,) = engine.capture(["shop.orders"])
        assert first.state == "succeeded", first.error
        table = engine.layout.dataset_table("shop", "orders")
        version, raw = table.version(), _raw_files(tmp_path)
        assert version is not None
        usage = engine.usage()
        (again,) = engine.capture(["shop.orders"])
        assert again.state == "succeeded", again.error
        assert again.stats is not None
        assert again.stats["orders"]["deliveries"] == 0
        assert table.version() == version
        assert _raw_files(tmp_path) == raw
        assert engine.usage() == usage
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 200}]

        # a change still replaces the projection, with every row of the source
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id = 1;")
        (changed,) = engine.capture(["shop.orders"])
        assert changed.state == "succeeded", changed.error
        assert table.version() == version + 1
        rows = engine.sql(
            "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'shipped') AS shipped "
            "FROM shop.orders"
        ).to_pylist()
        assert rows == [{"n": 200, "shipped": 1}]
    finally:
        engine.close()


def test_a_dropped_column_replaces_the_table_even_when_no_value_changed(
    tmp_path: Path, tools
) -> None:
    project = _project(tmp_path, tools)
    project.write_text(
        project.read_text().replace(
            "sync_mode: full_refresh\n", "sync_mode: full_refresh\n        drift: {drop: evolve}\n"
        )
    )
    engine = Engine.open(project)
    try:
        tools.sql(tmp_path, "ALTER TABLE orders ADD COLUMN channel TEXT;")
        (first,) = engine.capture(["shop.orders"])
        assert first.state == "succeeded", first.error
        tools.sql(tmp_path, "ALTER TABLE orders DROP COLUMN channel;")
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        columns = engine.sql("SELECT * FROM shop.orders LIMIT 1").schema.names
        assert "channel" not in columns
    finally:
        engine.close()


def _linked(table_dir: Path, files: list[str]) -> list[bool]:
    """Whether each table file is a Delivery linked as it is: named after its own bytes."""
    import hashlib

    from combined.lake._files import linked_name

    return [
        Path(f).name == linked_name(hashlib.sha256(Path(f).read_bytes()).hexdigest()) for f in files
    ]


def test_a_replacement_links_the_deliveries_and_keeps_the_old_version(
    tmp_path: Path, tools
) -> None:
    # Every row changed: the commit removes every file and adds the Deliveries
    # linked as they are, never rewriting their rows (issue 25).
    engine = Engine.open(_project(tmp_path, tools))
    try:
        engine.capture(["shop.orders"])
        table = engine.layout.dataset_table("shop", "orders")
        version, before = table.version(), table.files()
        assert version is not None
        assert before and all(_linked(Path(str(table.path)), before))  # (the first one too)
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped';")
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert table.version() == version + 1
        after = table.files()
        assert after and not set(after) & set(before)
        assert all(_linked(Path(str(table.path)), after))
        assert all(Path(f).stat().st_nlink > 1 for f in after)  # (the raw layer's inode too)
        rows = engine.sql(
            "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'shipped') AS shipped "
            "FROM shop.orders"
        ).to_pylist()
        assert rows == [{"n": 200, "shipped": 200}]
        old = table.delta(version).to_pyarrow_table(columns=["status"])
        assert old.num_rows == 200 and "shipped" not in old.column("status").to_pylist()
    finally:
        engine.close()


def test_a_replacement_killed_before_its_log_entry_lands_once(tmp_path: Path, tools) -> None:
    import signal

    project = _project(tmp_path, tools)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 50;")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "before_log"})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(project)
    try:
        rows = engine.sql(
            "SELECT count(*) AS n, count(DISTINCT _combined_id) AS ids, "
            "count(*) FILTER (WHERE status = 'shipped') AS shipped FROM shop.orders"
        ).to_pylist()
        assert rows == [{"n": 200, "ids": 200, "shipped": 50}]
        table = engine.layout.dataset_table("shop", "orders")
        assert all(_linked(Path(str(table.path)), table.files()))
    finally:
        engine.close()


def test_a_replacement_survives_the_loss_of_its_staging_after_its_commit(
    tmp_path: Path, tools
) -> None:
    """A replacement's change list (MAR's list of the rows that changed) is in no table:
    killed past its lake commit, its staging then lost, repair found the Deliveries in the
    table but not the list, and every later capture failed ("restore the files into the
    raw layer from a backup"). It is now put into the raw layer before the commit."""
    import shutil
    import signal

    project = _project(tmp_path, tools)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 50;")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    shutil.rmtree(tmp_path / "lake" / "_staging")  # the machine's disk, lost
    repaired = tools.cli(tmp_path, "repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(project)
    try:
        shipped = "SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'"
        assert engine.sql(shipped).to_pylist() == [{"n": 50}]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        assert (usage["mar"], usage["updates"]) == (200, 50)
    finally:
        engine.close()
