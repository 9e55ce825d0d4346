"""Output for scripts: whole ids in tables, ``--format json|csv``, query values without reprs."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine

NARROW = {"COLUMNS": "80"}  # what a pipe or a small terminal gets


def _ok(tools: Any, root: Path, *args: str) -> str:
    result = tools.cli(root, *args, env=NARROW)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return str(result.stdout)


@pytest.fixture
def captured(shop: Path, tools: Any) -> Path:
    """A shop captured twice (two runs, two dataset versions)."""
    _ok(tools, shop, "capture")
    tools.sql(shop, "UPDATE orders SET status = 'shipped' WHERE id <= 3")
    _ok(tools, shop, "capture")
    return shop


def test_piped_tables_show_every_id_whole(captured: Path, tools: Any) -> None:
    engine = Engine.open(captured / "combined.yaml")
    try:
        runs = engine.runs()
        versions = engine.history("shop.orders")
        pubs = engine.publications()
        deliveries = engine.run(runs[0].id)["deliveries"]
    finally:
        engine.close()
    listed = _ok(tools, captured, "runs")
    assert "…" not in listed
    for run in runs:  # each on one line, whole
        assert any(run.id in line and run.state in line for line in listed.splitlines())
    history = _ok(tools, captured, "history", "shop.orders")
    assert all(v["id"] in history for v in versions) and "…" not in history
    assert all(p["id"] in _ok(tools, captured, "publications") for p in pubs)
    shown = _ok(tools, captured, "run", "show", runs[0].id)
    assert all(d.id in shown for d in deliveries) and "…" not in shown
    status = _ok(tools, captured, "status")
    assert "shop.customers" in status and versions[-1]["id"] in status


def test_listing_commands_print_json_and_csv(captured: Path, tools: Any) -> None:
    runs = json.loads(_ok(tools, captured, "runs", "--format", "json"))
    assert [r["state"] for r in runs] == ["succeeded", "succeeded"]
    assert runs[0]["datasets"] == ["customers", "orders"] and runs[0]["created_at"].endswith(
        "+00:00"
    )
    table = list(csv.DictReader(io.StringIO(_ok(tools, captured, "runs", "--format", "csv"))))
    assert [r["id"] for r in table] == [r["id"] for r in runs]
    assert table[0]["error"] == "" and json.loads(table[0]["datasets"]) == ["customers", "orders"]

    shown = json.loads(_ok(tools, captured, "run", "show", runs[0]["id"], "--format", "json"))
    assert shown["run"]["id"] == runs[0]["id"] and shown["admission"]["connector"] == "sqlite"
    assert shown["deliveries"] and all(d["run_id"] == runs[0]["id"] for d in shown["deliveries"])

    history = json.loads(_ok(tools, captured, "history", "shop.orders", "--format", "json"))
    assert [v["updates"] for v in history] == [0, 3] and history[1]["parent_id"] == history[0]["id"]
    status = list(csv.DictReader(io.StringIO(_ok(tools, captured, "status", "--format", "csv"))))
    assert {s["dataset"] for s in status} == {"shop.customers", "shop.orders"}
    pubs = json.loads(_ok(tools, captured, "publications", "--format", "json"))
    assert pubs == json.loads(_ok(tools, captured, "publications", "--json"))
    assert {m["dataset"] for m in pubs[0]["members"]} == {"customers", "orders"}
    usage = list(csv.DictReader(io.StringIO(_ok(tools, captured, "usage", "--format", "csv"))))
    assert {u["dataset"]: int(u["updates"]) for u in usage}["orders"] == 3
    assert json.loads(_ok(tools, captured, "quarantine", "list", "--format", "json")) == []
    found = json.loads(_ok(tools, captured, "discover", "shop", "--format", "json"))
    assert {d["name"] for d in found["datasets"]} >= {"customers", "orders"}


def test_an_unknown_format_is_refused(captured: Path, tools: Any) -> None:
    result = tools.cli(captured, "runs", "--format", "yaml")
    assert result.returncode == 2 and "unknown format 'yaml'" in result.stderr
    result = tools.cli(captured, "run", "show", "r1", "--format", "csv")
    assert result.returncode == 2 and "use table, json" in result.stderr


QUERY = (
    "SELECT 'nan'::DOUBLE AS nan, 'inf'::DOUBLE AS inf, '-inf'::DOUBLE AS ninf, 1.5::DOUBLE AS f, "
    "'\\x00\\xFF'::BLOB AS b, [1, NULL, 3] AS l, ['\\xAA'::BLOB] AS bl, {'a': 1, 'b': 'x'} AS s, "
    "12345678901234567890.12::DECIMAL(24,2) AS d, TIMESTAMPTZ '2026-11-29 08:00:00+00' AS t, "
    "true AS yes, NULL AS nothing, (SELECT count(*) FROM shop.orders) AS n"
)


def test_sql_json_is_strict_and_lossless(captured: Path, tools: Any) -> None:
    out = _ok(tools, captured, "sql", "--format", "json", QUERY)

    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    (row,) = json.loads(out, parse_constant=refuse)  # NaN or Infinity would fail here
    assert (row["nan"], row["inf"], row["ninf"], row["f"]) == ("NaN", "Infinity", "-Infinity", 1.5)
    assert bytes.fromhex(row["b"]) == b"\x00\xff"
    assert row["l"] == [1, None, 3] and [bytes.fromhex(x) for x in row["bl"]] == [b"\xaa"]
    assert row["s"] == {"a": 1, "b": "x"} and row["d"] == "12345678901234567890.12"
    assert row["t"].startswith("2026-11-29T") and row["yes"] is True and row["nothing"] is None
    assert row["n"] == 200


def test_sql_csv_has_no_python_reprs(captured: Path, tools: Any) -> None:
    out = _ok(tools, captured, "sql", "--format", "csv", QUERY)
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert (row["nan"], row["inf"], row["ninf"]) == ("NaN", "Infinity", "-Infinity")
    assert bytes.fromhex(row["b"]) == b"\x00\xff" and "b'" not in out
    assert json.loads(row["l"]) == [1, None, 3] and json.loads(row["s"]) == {"a": 1, "b": "x"}
    assert row["yes"] == "true" and row["nothing"] == "" and "None" not in out
    assert row["t"].startswith("2026-11-29T") and "datetime" not in out


def test_sql_tables_show_binary_digests_as_hex(captured: Path, tools: Any) -> None:
    """A v2 identity is 16 bytes: a table showed it as a Python bytes repr (b'\\x..')."""
    shown = _ok(
        tools, captured, "sql", "SELECT _combined_id, _combined_payload_hash FROM shop.orders"
    )
    assert "b'" not in shown and 'b"' not in shown
    assert len(re.findall(r"\b[0-9a-f]{32}\b", shown)) >= 2


def test_runs_marks_a_cut_error_and_names_the_command_showing_it_whole(
    shop: Path, tools: Any
) -> None:
    # The error column was cut at 60 characters without a sign that it was.
    ghost = "a_relation_whose_long_name_pushes_the_error_well_past_sixty_characters"
    tools.sql(shop, f"CREATE TABLE {ghost} (id INTEGER PRIMARY KEY)")
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + f"      {ghost}:\n        key: [id]\n")
    tools.sql(shop, f"DROP TABLE {ghost}")
    failed = tools.cli(shop, "capture", f"shop.{ghost}", env=NARROW)
    assert failed.returncode != 0
    engine = Engine.open(project)
    try:
        (run,) = engine.runs(1)
        assert run.error and len(run.error.splitlines()[0]) > 60
    finally:
        engine.close()
    listed = tools.cli(shop, "runs", env={"COLUMNS": "400"})
    assert listed.returncode == 0, listed.stderr
    (line,) = [x for x in listed.stdout.splitlines() if run.id in x and "run show" not in x]
    assert run.error.splitlines()[0][:40] in line and "…" in line
    assert f"`combined run show {run.id}` shows one whole" in listed.stdout


def _commands(command: Any, path: tuple[str, ...] = ()) -> Any:
    """Every command under a (typer) click group, with its path of names."""
    for name, sub in getattr(command, "commands", {}).items():
        if hasattr(sub, "commands"):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def test_every_command_summary_is_one_sentence_without_hard_breaks() -> None:
    """A command list shows each command's first paragraph as written: a line break
    inside it is printed mid-sentence (``explain``, ``replay`` and ``plan`` did)."""
    import inspect

    import typer.main

    from combined.cli import app

    broken = {}
    found = 0
    for path, command in _commands(typer.main.get_command(app)):
        found += 1
        first = inspect.cleandoc(command.help or "").split("\n\n")[0]
        if not first or "\n" in first:
            broken[" ".join(path)] = first
    assert found > 25
    assert broken == {}
