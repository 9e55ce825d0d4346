"""The ``combined`` CLI run as a subprocess, the way a user runs it."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.errors import CombinedError

WIDE = {"COLUMNS": "250"}  # rich tables must not truncate what we assert on


def _ok(tools: Any, root: Path, *args: str) -> str:
    result = tools.cli(root, *args, env=WIDE)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return str(result.stdout)


@pytest.fixture
def captured(shop: Path, tools: Any) -> Path:
    """A shop project captured once through the CLI."""
    _ok(tools, shop, "capture")
    return shop


def test_help_exits_zero_quickly(tmp_path: Path, tools: Any) -> None:
    started = time.monotonic()
    result = tools.cli(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "capture" in result.stdout and "publications" in result.stdout
    assert time.monotonic() - started < 10


def test_init_writes_a_project_and_refuses_to_overwrite(tmp_path: Path, tools: Any) -> None:
    _ok(tools, tmp_path, "init")
    project = tmp_path / "combined.yaml"
    assert project.is_file() and "sources" in project.read_text()
    project.write_text("# mine\n" + project.read_text())
    again = tools.cli(tmp_path, "init")
    assert again.returncode != 0
    assert "already exists" in again.stderr and "--force" in again.stderr
    assert project.read_text().startswith("# mine\n")  # nothing overwritten
    _ok(tools, tmp_path, "init", "--force")
    assert not project.read_text().startswith("# mine\n")


def test_a_project_init_writes_runs_as_written(tmp_path: Path, tools: Any) -> None:
    # Its source pointed at a ./shop.db nothing wrote: `combined check` failed.
    said = _ok(tools, tmp_path, "init")
    assert "shop.db" in said and "combined check" in said
    assert "ok" in _ok(tools, tmp_path, "check")
    captured = _ok(tools, tmp_path, "capture")
    assert "succeeded" in captured and "shop.orders" in captured


def test_capture_three_times_in_a_row_each_exits_zero(shop: Path, tools: Any) -> None:
    for i in range(3):
        result = tools.cli(shop, "capture", env=WIDE)
        # 134 would be a native abort in a pyarrow/deltalake thread at exit
        assert result.returncode == 0, (i, result.returncode, result.stderr)
        assert "succeeded" in result.stdout
    engine = Engine.open(shop / "combined.yaml")
    try:
        runs = engine.runs()
        assert [r.state for r in runs] == ["succeeded"] * 3
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 200}]
    finally:
        engine.close()


def test_inspection_commands_print_what_was_captured(captured: Path, tools: Any) -> None:
    engine = Engine.open(captured / "combined.yaml")
    try:
        (run,) = engine.runs()
        (pub,) = engine.publications()
    finally:
        engine.close()

    runs_out = _ok(tools, captured, "runs")
    assert run.id in runs_out and "succeeded" in runs_out and "first_sync" in runs_out

    show = _ok(tools, captured, "run", "show", run.id)
    assert f"run {run.id}  succeeded" in show
    assert "attempt 1" in show and "committed" in show

    status = _ok(tools, captured, "status")
    assert "shop.orders" in status and "shop.customers" in status

    pubs = _ok(tools, captured, "publications")
    assert pub["id"] in pubs and "shop.orders@0" in pubs and "shop.customers@0" in pubs

    hist = _ok(tools, captured, "history", "shop.orders")
    assert pub["id"] in hist and " 200 " in hist and run.id in hist

    use = _ok(tools, captured, "usage")
    assert "orders" in use and " 200 " in use and " 20 " in use

    assert "the catalog matches the lake" in _ok(tools, captured, "repair")


def test_run_show_of_an_unknown_run_fails(captured: Path, tools: Any) -> None:
    result = tools.cli(captured, "run", "show", "r-does-not-exist")
    assert result.returncode != 0
    assert "r-does-not-exist" in result.stderr


def test_sql_formats(captured: Path, tools: Any) -> None:
    out = _ok(tools, captured, "sql", "SELECT count(*) AS n FROM shop.orders", "--format", "json")
    assert json.loads(out) == [{"n": 200}]

    out = _ok(
        tools,
        captured,
        "sql",
        "SELECT id, status FROM shop.orders ORDER BY id LIMIT 2",
        "--format",
        "csv",
    )
    assert list(csv.reader(io.StringIO(out))) == [
        ["id", "status"],
        ["1", "placed"],
        ["2", "placed"],
    ]

    bad = tools.cli(captured, "sql", "SELECT 1", "--format", "xml")
    assert bad.returncode != 0 and "xml" in bad.stderr


def test_sql_as_of_before_any_publication_fails_clearly(captured: Path, tools: Any) -> None:
    result = tools.cli(
        captured, "sql", "SELECT count(*) FROM shop.orders", "--as-of", "2000-01-01T00:00:00Z"
    )
    assert result.returncode != 0
    assert "nothing was published at or before 2000-01-01" in result.stderr
    assert result.stdout == ""

    garbled = tools.cli(captured, "sql", "SELECT 1", "--as-of", "yesterday-ish")
    assert garbled.returncode != 0 and "ISO-8601" in garbled.stderr


def test_sql_publication_selects_an_earlier_state(captured: Path, tools: Any) -> None:
    engine = Engine.open(captured / "combined.yaml")
    try:
        (first,) = engine.publications()
    finally:
        engine.close()
    tools.sql(captured, "DELETE FROM orders WHERE id <= 50;")
    _ok(tools, captured, "capture")
    query = "SELECT count(*) AS n FROM shop.orders"
    assert json.loads(_ok(tools, captured, "sql", query, "--format", "json")) == [{"n": 150}]
    earlier = _ok(tools, captured, "sql", query, "--format", "json", "--publication", first["id"])
    assert json.loads(earlier) == [{"n": 200}]


# -- untrusted text (errors, names, SQL, paths, values) is printed as written --


def test_markup_in_a_selector_is_printed_as_written(shop: Path, tools: Any) -> None:
    result = tools.cli(shop, "capture", "shop.[/x]")
    assert result.returncode == 2, result.stderr
    assert "unknown dataset '[/x]' in source 'shop'" in result.stderr
    assert "Traceback" not in result.stderr


def test_sql_errors_and_values_are_printed_as_written(captured: Path, tools: Any) -> None:
    echoed = tools.cli(captured, "sql", "selec '[/b]'")
    assert echoed.returncode == 2, echoed.stderr
    assert "selec '[/b]'" in echoed.stderr and "Traceback" not in echoed.stderr

    query = "select regexp_matches(status, '[a-z]+') from shop.orders wher 1"
    typo = tools.cli(captured, "sql", query)
    assert typo.returncode == 2, typo.stderr
    assert "'[a-z]+')" in typo.stderr  # not "'+')": nothing taken for a style tag

    out = _ok(tools, captured, "sql", "SELECT ':cat: [red]x[/red]' AS \"[b]h\"")
    assert ":cat: [red]x[/red]" in out and "[b]h" in out


def test_sql_only_reads_the_published_basis(captured: Path, tools: Any) -> None:
    outside = captured / "outside.csv"
    outside.write_text("secret\n")
    engine = Engine.open(captured / "combined.yaml")
    try:
        lake = captured / "lake"
        data_file = next((lake / "shop" / "orders").glob("*.parquet"))
        refused = {
            f"COPY (SELECT 1 AS x) TO '{captured / 'written.csv'}'": "not COPY",
            f"COPY (SELECT 1 AS x) TO '{data_file}' (FORMAT csv, USE_TMP_FILE false)": "not COPY",
            f"ATTACH '{captured / 'new.db'}' AS x": "not ATTACH",
            "CREATE TABLE t AS SELECT 1": "not CREATE",
            "SELECT 1; SELECT 2": "2 statements",
            "  ": "the query is empty",
            f"SELECT * FROM read_csv('{outside}')": "Permission Error",
            f"SELECT count(*) FROM read_parquet('{lake}/_deliveries/**/*.parquet')": (
                "Permission Error"
            ),
            "SET enable_external_access = true": "not SET",
        }
        for query, said in refused.items():
            with pytest.raises(CombinedError) as caught:
                engine.sql(query)
            assert said in caught.value.message, (query, caught.value.message)
            assert caught.value.hint
            if said == "Permission Error":  # (it said how tables are named, not what is read)
                assert "reads the published tables only" in caught.value.hint
        assert not (captured / "written.csv").exists() and not (captured / "new.db").exists()
        # the lake's own file is untouched: the published rows are all still there
        rows = engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist()
        assert rows == [{"n": 200}]
        described = engine.sql("DESCRIBE shop.orders").column("column_name").to_pylist()
        assert "id" in described
    finally:
        engine.close()
    result = tools.cli(captured, "sql", f"COPY (SELECT 1) TO '{captured / 'cli.csv'}'")
    assert result.returncode == 2, result.stderr
    assert "not COPY" in result.stderr and "hint:" in result.stderr
    assert not (captured / "cli.csv").exists()


def test_discovered_names_are_printed_as_written(shop: Path, tools: Any) -> None:
    tools.sql(shop, 'CREATE TABLE "[/t]" (id INTEGER PRIMARY KEY, "[/b] note" TEXT);')
    out = _ok(tools, shop, "discover", "shop")
    assert "[/t] (table" in out and "[/b] note" in out


def test_a_retried_error_quoting_markup_is_retried_and_recorded_as_written(
    shop: Path, tools: Any
) -> None:
    project = shop / "combined.yaml"
    project.write_text(project.read_text().replace("path: ./shop.db", 'path: "./data[/x].db"'))
    result = tools.cli(shop, "capture", env=WIDE)
    assert result.returncode == 1, result.stderr
    # the engine's retry note reaches the terminal as written, and the retries go on
    assert "attempt 2 failed (" in result.stderr and "data[/x].db" in result.stderr
    assert "MarkupError" not in result.stdout + result.stderr
    engine = Engine.open(project)
    try:
        (run,) = engine.runs()
        attempts = engine.run(run.id)["attempts"]
    finally:
        engine.close()
    assert run.state == "failed"
    assert run.error is not None and "data[/x].db' does not exist" in run.error
    assert [a.number for a in attempts] == [1, 2, 3]

    assert run.id in _ok(tools, shop, "runs")
    assert "data[/x].db' does not exist" in _ok(tools, shop, "run", "show", run.id)
    check = tools.cli(shop, "check", env=WIDE)
    assert check.returncode == 1, check.stderr
    assert "fail shop: " in check.stdout and "data[/x].db' does not exist" in check.stdout


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (("usage", "--month", "garbage"), "--month 'garbage' is not a month", "YYYY-MM"),
        (("usage", "--month", "2026-13"), "--month '2026-13' is not a month", "YYYY-MM"),
        (("history", "shop"), "history takes SOURCE.DATASET, not 'shop'", "shop.orders"),
        (("history", ".orders"), "history takes SOURCE.DATASET", "shop.orders"),
    ],
)
def test_a_malformed_argument_is_refused_with_the_form_to_use(
    shop: Path, tools: Any, args: tuple[str, ...], message: str, hint: str
) -> None:
    result = tools.cli(shop, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr and hint in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("debug", [False, True])
def test_an_unanticipated_error_is_one_redacted_line_and_exit_70(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any, debug: bool
) -> None:
    # The defect stands in for any bug: the real command, the real entry point.
    from combined import cli
    from combined.runtime import _runner

    tools.make(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["combined", "capture", "shop.orders"])
    if debug:
        monkeypatch.setenv("COMBINED_DEBUG", "1")
    else:
        monkeypatch.delenv("COMBINED_DEBUG", raising=False)

    def defect(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom at postgresql://app:hunter2@db/x")

    monkeypatch.setattr(_runner.Runner, "recover", defect)
    if debug:
        with pytest.raises(RuntimeError, match="boom"):
            cli.main()
        return
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == cli.INTERNAL_ERROR
    err = capsys.readouterr().err
    assert "internal error (RuntimeError): boom at postgresql://app:***@db/x" in err
    assert "COMBINED_DEBUG=1" in err
    assert "hunter2" not in err and "Traceback" not in err


def test_a_defect_inside_a_run_logs_its_redacted_trace_at_debug(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # The Run ends failed with the error's one line; its trace is for a report of it.
    from combined import cli
    from combined.runtime import _runner

    tools.make(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMBINED_DEBUG", raising=False)

    def defect(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom at postgresql://app:hunter2@db/x")

    monkeypatch.setattr(_runner.Runner, "_execute", defect)
    for level, traced in (("INFO", False), ("DEBUG", True)):
        argv = ["combined", "--log-format", "json", "--log-level", level, "capture", "shop.orders"]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exited:
            cli.main()
        assert exited.value.code == 1
        err = capsys.readouterr().err
        assert "hunter2" not in err
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        trace = [r for r in lines if "ended by an unexpected error" in r["message"]]
        assert bool(trace) is traced, err
        if traced:
            (record,) = trace
            assert record["level"] == "DEBUG" and record["logger"] == "combined.runtime._runner"
            assert "Traceback" in record["exc_info"] and "in defect" in record["exc_info"]
            assert "postgresql://app:***@db/x" in record["exc_info"]


def test_exit_status_tells_what_a_run_needs(shop: Path, tools: Any) -> None:
    # A scheduler acts on the status alone: 1 retry later, 3 review, 4 credentials.
    tools.sql(
        shop,
        "CREATE TABLE people (id INTEGER, name TEXT);INSERT INTO people VALUES (1, 'a'), (1, 'b');",
    )
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + "      people:\n        key: [id]\n")
    review = tools.cli(shop, "capture", "shop.people")
    assert review.returncode == 3, (review.stdout, review.stderr)
    assert "needs_review" in review.stdout

    ok = tools.cli(shop, "capture", "shop.orders")
    assert ok.returncode == 0, ok.stderr
    # one run succeeds, one needs review: the review decides
    both = tools.cli(shop, "capture")
    assert both.returncode == 3, (both.stdout, both.stderr)

    (shop / "shop.db").rename(shop / "away.db")
    failed = tools.cli(shop, "capture", "shop.orders")
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert "failed" in failed.stdout
    (shop / "away.db").rename(shop / "shop.db")

    api = shop / "api"
    api.mkdir()
    (api / "combined.yaml").write_text(
        json.dumps(
            {
                "version": 1,
                "lake": "./lake",
                "sources": {
                    "api": {
                        "connector": "scripted",
                        "config": {
                            "datasets": {"orders": {"fields": {"id": "int64"}, "key": ["id"]}},
                            "script": [{"rows": [{"id": 1}], "fail": "auth"}],
                            "state_file": str(api / "reads.json"),
                        },
                        "datasets": {"orders": {"key": ["id"]}},
                    }
                },
            }
        )
    )
    auth = tools.cli(api, "capture")
    assert auth.returncode == 4, (auth.stdout, auth.stderr)
    assert "needs_auth" in auth.stdout

    usage = tools.cli(shop, "capture", "nosuch")
    assert usage.returncode == 2, (usage.stdout, usage.stderr)
