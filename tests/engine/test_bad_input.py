"""Bad input: a clear error, a non-zero exit, and nothing already captured is lost."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.errors import ConfigError

ORDERS_QUERY = "SELECT count(*) AS n FROM shop.orders"


def _orders(root: Path) -> int:
    engine = Engine.open(root / "combined.yaml")
    try:
        return int(engine.sql(ORDERS_QUERY).column("n")[0].as_py())
    finally:
        engine.close()


def test_malformed_yaml_names_the_file_and_loses_nothing(captured: Path, tools: Any) -> None:
    project = captured / "combined.yaml"
    good = project.read_text()
    project.write_text(good + "  broken: [unclosed\n")
    result = tools.cli(captured, "capture")
    assert result.returncode == 2
    assert str(project) in result.stderr and "invalid YAML" in result.stderr
    project.write_text(good)
    assert _orders(captured) == 200


def test_unknown_key_names_the_file_and_dotted_path(captured: Path, tools: Any) -> None:
    project = captured / "combined.yaml"
    good = project.read_text()
    project.write_text(good.replace("      orders:\n", "      orders:\n        colour: red\n"))
    result = tools.cli(captured, "capture")
    assert result.returncode == 2
    assert str(project) in result.stderr
    assert "sources.shop.datasets.orders.colour is not a known key" in result.stderr
    assert "known keys here" in result.stderr
    project.write_text(good)
    assert _orders(captured) == 200


def _catalog_text(root: Path) -> str:
    """Every row of every table of the project's SQLite catalog, as text."""
    con = sqlite3.connect(root / ".combined" / "catalog.db")
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for t in tables for row in con.execute(f'SELECT * FROM "{t}"'))
    finally:
        con.close()


def _configure(root: Path, lines: str) -> None:
    """Add ``lines`` (YAML, indented) to the shop source's ``config``."""
    project = root / "combined.yaml"
    project.write_text(
        project.read_text().replace("      path: ./shop.db\n", f"      path: ./shop.db\n{lines}")
    )


def test_a_misspelt_connector_key_is_refused_before_the_catalog_stores_it(
    captured: Path, tools: Any
) -> None:
    _configure(captured, '      pasword: {secret: "env:SHOP_PW"}\n')
    result = tools.cli(captured, "capture", env={"SHOP_PW": "SECRETPW"})
    assert result.returncode == 2
    assert "sources.shop.config.pasword is not a known key of the sqlite connector" in (
        result.stderr
    )
    assert "the sqlite connector takes: batch_rows, busy_timeout_ms, path" in result.stderr
    catalog = _catalog_text(captured)
    assert "./shop.db" in catalog and "pasword" not in catalog
    result = tools.cli(captured, "check", env={"SHOP_PW": "SECRETPW"})
    shown = " ".join((result.stdout + result.stderr).split())  # check wraps its lines
    assert result.returncode != 0 and "sources.shop.config.pasword is not a known key" in shown


LITERAL_SECRETS = """\
      dsn: host=h dbname=d sslpassword=SECRETPW1
      pasword: SECRETPW2
      pgpassword: SECRETPW3
      sslpassword: SECRETPW4
      aws_secret_access_key: SECRETPW5
      api: {token: {value: SECRETPW6}}
      api_keys: [SECRETPW7]
"""


def test_literal_secrets_under_any_credential_name_are_refused_at_load(
    captured: Path, tools: Any
) -> None:
    _configure(captured, LITERAL_SECRETS)
    for command in ("check", "capture"):
        result = tools.cli(captured, command)
        assert result.returncode == 2
        assert "SECRETPW" not in result.stdout + result.stderr
        assert "sources.shop.config.dsn holds a connection string with an inline credential" in (
            result.stderr
        )
        for path in ("pasword", "pgpassword", "sslpassword", "aws_secret_access_key"):
            assert f"sources.shop.config.{path} holds a literal secret" in result.stderr
        assert "sources.shop.config.api.token.value holds a literal secret" in result.stderr
        assert "sources.shop.config.api_keys[0] holds a literal secret" in result.stderr
        assert 'use {secret: "env:NAME"} or {secret: "file:PATH"}' in result.stderr
    assert "SECRETPW" not in _catalog_text(captured)


@pytest.mark.parametrize(
    ("value", "predicate"), [(None, "is not set"), ("", "is empty")], ids=["unset", "empty"]
)
def test_an_unusable_secret_is_named_and_the_run_needs_auth(
    captured: Path,
    tools: Any,
    pg_server_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
    predicate: str,
) -> None:
    monkeypatch.delenv("NOPE_PW", raising=False)
    tools.add_pg_source(captured, "crm", pg_server_dsn, "NOPE_PW")
    # Set but empty must not silently mean "no password".
    env = {} if value is None else {"NOPE_PW": value}
    result = tools.cli(captured, "capture", "crm", env=env)
    # A credential the operator must provide: needs_auth, exit 4, not "retry later".
    assert result.returncode == 4
    # The run's error is printed with the run (stdout).
    output = result.stdout + result.stderr
    assert f"secret env:NOPE_PW at sources.crm.config.password {predicate}" in output
    assert "needs_auth" in result.stdout
    assert _orders(captured) == 200  # the earlier publication still answers


@pytest.mark.parametrize(
    ("selector", "message", "hint"),
    [
        ("nosuch", "unknown source 'nosuch'", "known sources: shop"),
        ("shop.nosuch", "unknown dataset 'nosuch' in source 'shop'", "customers, orders"),
        # a trailing dot must not widen the capture to every dataset of shop
        ("shop.", "'shop.' is not SOURCE or SOURCE.DATASET", "e.g. shop or shop.orders"),
        (".orders", "'.orders' is not SOURCE or SOURCE.DATASET", "e.g. shop or shop.orders"),
    ],
)
def test_unknown_selector_lists_known_names(
    captured: Path, tools: Any, selector: str, message: str, hint: str
) -> None:
    result = tools.cli(captured, "capture", selector)
    assert result.returncode == 2
    assert message in result.stderr and hint in result.stderr
    engine = Engine.open(captured / "combined.yaml")
    try:
        assert len(engine.runs()) == 1  # no run was admitted for the bad selector
    finally:
        engine.close()


def test_unreachable_sqlite_fails_after_three_attempts(
    captured: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    (captured / "shop.db").rename(captured / "elsewhere.db")
    engine = Engine.open(captured / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "failed"
        assert run.error is not None and "shop.db' does not exist" in run.error
        attempts = engine.run(run.id)["attempts"]
        assert [a.number for a in attempts] == [1, 2, 3]
        assert all(a.outcome == "failed" for a in attempts)
        assert _orders(captured) == 200
    finally:
        engine.close()


def test_a_relation_gone_names_its_dataset_the_source_and_the_datasets_held_back(
    captured: Path, tools: Any
) -> None:
    """The Run's error said "table 'customers' does not exist" with the hint
    "`combined discover SOURCE` lists ...": which dataset, which source, and
    that shop.orders went uncaptured with it, were left to guess."""
    tools.sql(captured, "ALTER TABLE customers RENAME TO clients;")
    engine = Engine.open(captured / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "failed"
        error = run.error or ""
        assert error.startswith("shop.customers: "), error
        assert "`combined discover shop`" in error and "SOURCE" not in error
        assert "this Run's other datasets (shop.orders) were not committed either" in error
    finally:
        engine.close()


def _scripted(
    root: Path,
    script: list[dict[str, Any]],
    fields: dict[str, str],
    key: list[str] | None = None,
) -> Engine:
    root.mkdir(parents=True, exist_ok=True)
    project = {
        "version": 1,
        "lake": "./lake",
        "catalog": "sqlite:///.combined/catalog.db",
        "sources": {
            "api": {
                "connector": "scripted",
                "config": {
                    "datasets": {"orders": {"fields": fields, "key": key or []}},
                    "script": script,
                    "state_file": str(root / "reads.json"),
                },
                "datasets": {"orders": {"key": ["id"]}},
            }
        },
    }
    (root / "combined.yaml").write_text(json.dumps(project))
    return Engine.open(root / "combined.yaml")


ROWS = [{"id": i, "qty": i * 10} for i in range(1, 6)]
INTS = {"id": "int64", "qty": "int64"}


def test_rejected_credentials_need_auth_without_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    engine = _scripted(tmp_path, [{"rows": ROWS, "fail": "auth"}], INTS)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_auth"
        assert run.error is not None and "rejected the credentials" in run.error
        assert len(engine.run(run.id)["attempts"]) == 1
        assert engine.run(run.id)["deliveries"] == []
        assert not (tmp_path / "lake" / "api").exists()
    finally:
        engine.close()


def test_record_of_the_wrong_type_needs_review_and_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    # after the first good batch comes a record whose qty is text, not int64
    script = [{"batches": [ROWS[:1], ROWS[1:]], "fail": "schema", "after_batches": 1}]
    engine = _scripted(tmp_path, script, INTS, key=["id"])
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert run.error is not None
        assert "does not fit the declared schema" in run.error and "'qty'" in run.error
        assert len(engine.run(run.id)["attempts"]) == 1  # a bad record is not retried
        assert engine.run(run.id)["deliveries"] == []
        assert not (tmp_path / "lake" / "api" / "orders").exists()
        assert engine.publications() == []
    finally:
        engine.close()


def test_a_misfit_first_batch_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    engine = _scripted(tmp_path, [{"rows": ROWS, "fail": "schema"}], INTS)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "column 'id' is declared int64, the record holds string" in (run.error or "")
        assert not (tmp_path / "lake" / "api" / "orders").exists()
        assert engine.publications() == []
    finally:
        engine.close()


def test_transient_failure_succeeds_on_the_second_attempt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    engine = _scripted(tmp_path, [{"rows": ROWS, "fail": "unavailable", "fail_times": 1}], INTS)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        attempts = engine.run(run.id)["attempts"]
        assert len(attempts) == 2
        assert attempts[0].outcome == "failed" and "unavailable" in (attempts[0].error or "")
        result = engine.sql("SELECT id, qty FROM api.orders ORDER BY id").to_pylist()
        assert result == ROWS  # every row landed exactly once
        deliveries = engine.run(run.id)["deliveries"]
        assert [(d.state, d.record_count) for d in deliveries] == [("committed", 5)]
    finally:
        engine.close()


def test_a_negative_limit_is_refused_not_read_as_no_limit(captured: Path, tools: Any) -> None:
    assert tools.cli(captured, "capture").returncode == 0
    engine = Engine.open(captured / "combined.yaml")
    try:
        assert len(engine.runs(1)) == 1 and len(engine.publications(1)) == 1
        for listing in (engine.runs, engine.publications):
            with pytest.raises(ConfigError, match="--limit must be 0 or more, not -1") as caught:
                listing(-1)  # SQLite took LIMIT -1 as every row
            assert caught.value.hint == "e.g. --limit 20"
    finally:
        engine.close()


def test_quarantine_list_of_an_unknown_source_is_refused(captured: Path, tools: Any) -> None:
    result = tools.cli(captured, "quarantine", "list", "--source", "shpo")
    assert result.returncode == 2, result.stdout  # not "nothing awaits review"
    assert "unknown source 'shpo'" in result.stderr and "known sources: shop" in result.stderr
    engine = Engine.open(captured / "combined.yaml")
    try:
        assert engine.quarantine("shop") == []  # a declared source with no entries is fine
    finally:
        engine.close()


def test_retrying_a_succeeded_run_says_what_to_do_instead(captured: Path, tools: Any) -> None:
    engine = Engine.open(captured / "combined.yaml")
    try:
        (run,) = engine.runs()
    finally:
        engine.close()
    run_id = run.id
    result = tools.cli(captured, "run", "retry", run_id)
    assert result.returncode == 2, result.stdout
    assert f"run {run_id} succeeded; there is nothing to retry" in result.stderr
    assert (
        "hint: run `combined capture shop.customers shop.orders` to read its datasets again"
    ) in result.stderr
