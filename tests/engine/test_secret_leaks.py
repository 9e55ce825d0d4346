"""No secret reaches a program it was not given, nor any text Combined stores or shows.

Regression tests of the adversarial review's secret findings (issue 23, items
1 to 4 and 23): each docstring says how the leak was reproduced.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import cli
from tests.connectors.http.fake_api import FakeAPI, order, serve
from tests.connectors.singer.fixtures import TAPS
from tests.echo_postgres import echoing_postgres

from combined.engine import Engine

PGPW = "pg-Secret-4411-zz"
SHOP_PW = "shop.Secret/77+x"
CATALOG_PW = "catalog-Secret-903"
TAP_TOKEN = "tap-Token-5a5a5a5a"

PROJECT = """\
version: 1
lake: ./lake
sources:
  gh:
    connector: singer
    config:
      command: [{python}, {tap}]
      config:
        script: {script}
        api_token: {{secret: "env:TAP_TOKEN"}}
      inherit_env: [COMBINED_TEST_PASSED]
    datasets:
      s: {{key: [id]}}
  pg:
    connector: postgres
    config:
      host: 127.0.0.1
      user: app
      password: {{secret: "env:PGPW"}}
    datasets: {{}}
  shop:
    connector: postgres
    config:
      host: 127.0.0.1
      user: shop
      password: {{secret: "env:SHOP_PW"}}
      sslpassword: {{secret: "env:CATALOG_PW"}}
    datasets: {{}}
"""

SCHEMA = {
    "type": "SCHEMA",
    "stream": "s",
    "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    "key_properties": ["id"],
}


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("PGPW", PGPW),
        ("SHOP_PW", SHOP_PW),
        ("CATALOG_PW", CATALOG_PW),
        ("TAP_TOKEN", TAP_TOKEN),
        ("COMBINED_TEST_PASSED", "passed-on-purpose"),
        ("COMBINED_TEST_NOT_LISTED", "not-for-programs"),
    ):
        monkeypatch.setenv(name, value)


def _project(root: Path, steps: list[dict[str, Any]]) -> Path:
    catalog = {"streams": [{"tap_stream_id": "s", "schema": SCHEMA["schema"]}]}
    (root / "script.json").write_text(json.dumps({"catalog": catalog, "steps": steps}))
    (root / "combined.yaml").write_text(
        PROJECT.format(
            python=json.dumps(sys.executable),
            tap=json.dumps(str(TAPS / "script_tap.py")),
            script=json.dumps(str(root / "script.json")),
        )
    )
    return root / "combined.yaml"


def _stored_text(engine: Engine, run_id: str) -> str:
    """Everything the catalog holds about a Run: its row, attempts and Activity events."""
    import sqlalchemy as sa

    from combined.catalog import _schema as t

    with engine.catalog.begin() as conn:
        rows = [
            *conn.execute(sa.select(t.runs).where(t.runs.c.id == run_id)),
            *conn.execute(sa.select(t.attempts).where(t.attempts.c.run_id == run_id)),
            *conn.execute(sa.select(t.activity)),
        ]
    return "\n".join(repr(tuple(row)) for row in rows)


@pytest.mark.usefixtures("secrets")
def test_a_program_inherits_no_secret_and_its_output_is_masked(tmp_path: Path) -> None:
    """Reproduction: a tap that prints its environment and fails.

    Before: the tap got Combined's environment less names that look like
    credentials, so PGPW, SHOP_PW and CATALOG_PW (names other sources'
    references use) reached it, and its environment dump landed in the Run
    error, the catalog and ``GET /v1/runs``. A value the tap learned
    elsewhere (here written in its script) was stored as it was.
    """
    env_file = tmp_path / "env.json"
    steps: list[dict[str, Any]] = [
        {"out": json.dumps(SCHEMA)},
        {"env_file": str(env_file)},
        {"env_err": True},
        {"err": f"connecting with {PGPW} and {SHOP_PW} and {CATALOG_PW} and {TAP_TOKEN}"},
        {"exit": 3},
    ]
    engine = Engine.open(_project(tmp_path, steps))
    try:
        (run,) = engine.capture(["gh.s"])
        assert run.state == "failed"
        env = json.loads(env_file.read_text())
        for name in ("PGPW", "SHOP_PW", "CATALOG_PW", "TAP_TOKEN", "COMBINED_TEST_NOT_LISTED"):
            assert name not in env, name
        assert env["COMBINED_TEST_PASSED"] == "passed-on-purpose"
        assert env["PATH"]
        stored = _stored_text(engine, run.id)
        assert "connecting with *** and *** and *** and ***" in (run.error or "")
    finally:
        engine.close()
    for value in (PGPW, SHOP_PW, CATALOG_PW, TAP_TOKEN):
        assert value not in (run.error or "")
        assert value not in stored
    shown = cli(tmp_path, "run", "show", run.id)
    assert "***" in shown.stdout + shown.stderr
    assert not any(v in shown.stdout + shown.stderr for v in (PGPW, SHOP_PW, CATALOG_PW))


@pytest.mark.usefixtures("secrets")
def test_inherit_env_refuses_a_variable_a_secret_reference_names(tmp_path: Path) -> None:
    """``inherit_env: [PGPW]`` would hand another source's password to the tap: refused."""
    project = _project(tmp_path, [{"out": json.dumps(SCHEMA)}])
    text = project.read_text().replace("[COMBINED_TEST_PASSED]", "[PGPW]")
    project.write_text(text)
    result = cli(tmp_path, "capture", "gh.s", env={"PGPW": PGPW})
    assert result.returncode == 2, result.stdout + result.stderr  # before any Run
    assert "run r" not in result.stdout
    assert "inherit_env` names PGPW, which holds a secret" in result.stderr
    assert PGPW not in result.stdout + result.stderr


@pytest.mark.usefixtures("secrets")
def test_a_record_echoing_the_token_is_described_not_quoted(tmp_path: Path) -> None:
    """Reproduction: a tap returning the credential it was sent in an integer field.

    Before: ``field 'id' of stream 's' holds 'x Bearer tap-Token-...'`` was
    the Run error, stored in runs, attempts and Activity and served by the API.
    """
    steps: list[dict[str, Any]] = [
        {"out": json.dumps(SCHEMA)},
        {"out": json.dumps({"type": "RECORD", "stream": "s", "record": {"id": 1}})},
        {
            "out": json.dumps(
                {"type": "RECORD", "stream": "s", "record": {"id": f"x Bearer {TAP_TOKEN}"}}
            )
        },
    ]
    engine = Engine.open(_project(tmp_path, steps))
    try:
        (run,) = engine.capture(["gh.s"])
        stored = _stored_text(engine, run.id)
    finally:
        engine.close()
    assert run.state == "needs_review"
    assert "holds text of 27 characters, which is not an integer" in (run.error or "")
    assert TAP_TOKEN not in (run.error or "") and TAP_TOKEN not in stored


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    for fake in serve():
        for i in range(1, 4):
            fake.orders[i] = order(i, day=i)
        yield fake


def test_an_api_echoing_its_token_in_a_record_gets_a_described_value(
    tmp_path: Path, api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: ``{"total": "x Bearer <token>"}`` for a declared decimal field.

    Before: the SchemaMismatch quoted the value, token included, into the Run error.
    """
    monkeypatch.setenv("SHOP_API_TOKEN", api.token)
    api.orders[2]["total"] = f"x Bearer {api.token}"
    (tmp_path / "combined.yaml").write_text(
        f"""\
version: 1
lake: ./lake
sources:
  api:
    connector: http
    config:
      base_url: {api.base_url}
      auth: {{type: bearer, token: {{secret: "env:SHOP_API_TOKEN"}}}}
      endpoints:
        orders: {{path: /orders/plain, fields: {{total: "decimal(2)"}}}}
    datasets:
      orders: {{key: [id]}}
"""
    )
    result = cli(tmp_path, "capture", env={"SHOP_API_TOKEN": api.token})
    shown = cli(tmp_path, "runs")
    everything = result.stdout + result.stderr + shown.stdout + shown.stderr
    assert result.returncode == 3, everything
    assert f"holds text of {len(api.orders[2]['total'])} characters" in result.stdout + (
        result.stderr
    )
    assert api.token not in everything


def test_a_catalog_error_echoing_the_password_is_masked(tmp_path: Path) -> None:
    """Reproduction: a catalog server whose login error quotes ``catalog_password``.

    Before: ``cannot open the catalog at ...: FATAL: password <value> is not
    the right one`` was printed as it was.
    """
    port, thread = echoing_postgres()
    (tmp_path / "combined.yaml").write_text(
        f"""\
version: 1
lake: ./lake
catalog: postgresql://combined@127.0.0.1:{port}/combined
catalog_password: {{secret: "env:CATALOG_PW"}}
sources: {{}}
"""
    )
    result = cli(tmp_path, "runs", env={"CATALOG_PW": CATALOG_PW, "PGCONNECT_TIMEOUT": "10"})
    thread.join(timeout=1)
    assert result.returncode == 2, result.stderr
    assert "password *** is not the right one" in result.stderr
    assert CATALOG_PW not in result.stdout + result.stderr


# -- resolving secrets ----------------------------------------------------------------


def test_a_file_secret_holding_a_nul_byte_is_refused(tmp_path: Path) -> None:
    """Reproduction: ``file:`` secret ``abc\\0def``; libpq read it as ``abc``, silently."""
    from combined.config import resolve_secret
    from combined.errors import SecretError

    (tmp_path / "pw").write_bytes(b"first-part\0second-part\n")
    with pytest.raises(SecretError) as info:
        resolve_secret("file:pw", tmp_path, where="sources.pg.config.password")
    assert "holds a NUL byte" in info.value.message
    assert "first-part" not in info.value.describe()


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_or_empty_secret_is_needs_auth_exit_4(tmp_path: Path, value: str | None) -> None:
    """Reproduction: capture with ``TAP_TOKEN`` unset (or empty).

    Before: the Run ended ``failed``, exit 1 ("retry later"), though no retry
    can help until the operator sets the credential.
    """
    _project(tmp_path, [{"out": json.dumps(SCHEMA)}])
    env = {"TAP_TOKEN": value} if value is not None else {}
    result = cli(tmp_path, "capture", "gh.s", env={**env, "PGPW": "x", "SHOP_PW": "y"})
    assert result.returncode == 4, result.stdout + result.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.runs(1)
    finally:
        engine.close()
    assert run.state == "needs_auth"
    assert "secret env:TAP_TOKEN at sources.gh.config.config.api_token is" in (run.error or "")


# -- recorded decisions -------------------------------------------------------------------


def test_a_reset_reason_holding_a_secret_is_kept_masked(
    tmp_path: Path, tools: Any, pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: `combined reset shop.orders --reason "... <the PostgreSQL password> ..."`.

    Before: the Activity event masked it, but the reset's record kept the
    reason as typed in the catalog (``dataset_resets``) and the lake's ledger
    (``_combined/resets``), and `combined sql` of a publication made before
    the reset printed it.
    """
    import shutil
    import sqlite3

    from combined.lake._ledger import Ledger

    monkeypatch.setenv("PGPW", PGPW)
    project = tools.make(tmp_path, orders=5)
    tools.add_pg_source(tmp_path, "pg", pg_server_dsn, "PGPW")
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0
    engine = Engine.open(project)
    try:
        old = engine.publications(1)[0]["id"]
    finally:
        engine.close()
    shutil.rmtree(tmp_path / "lake" / "shop" / "orders")
    reason = f"lost; logged in with {PGPW}, api_key={TAP_TOKEN}"
    reset = tools.cli(tmp_path, "reset", "shop.orders", "--reason", reason, "--yes")
    assert reset.returncode == 0, reset.stderr
    with sqlite3.connect(tmp_path / ".combined" / "catalog.db") as con:
        ((kept,),) = con.execute("SELECT reason FROM dataset_resets").fetchall()
    assert kept == "lost; logged in with ***, api_key=***"
    engine = Engine.open(project)
    try:
        (ledger,) = Ledger(engine.layout).resets()
    finally:
        engine.close()
    assert ledger["reason"] == kept
    query = tools.cli(tmp_path, "sql", "SELECT * FROM shop.orders", "--publication", old)
    assert query.returncode == 2, query.stderr
    assert "logged in with ***, api_key=***" in query.stdout + query.stderr
    for value in (PGPW, TAP_TOKEN):
        assert value not in query.stdout + query.stderr + json.dumps(ledger)


def test_a_cancel_reason_holding_a_credential_is_kept_masked(shop: Path, tools: Any) -> None:
    """Reproduction: `combined run cancel RUN --reason "password=... pasted"`.

    Before: the Activity events masked it, but the Run's ``cancel_reason``
    kept it as typed, and `combined run show` printed it.
    """
    queued = tools.cli(shop, "capture", "shop.orders", "--enqueue")
    assert queued.returncode == 0, queued.stderr
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.queued()
        reason = f"password={PGPW} pasted"
        done = tools.cli(shop, "run", "cancel", run.id, "--reason", reason, "--by", "bob")
        assert done.returncode == 0, done.stderr
        (ended,) = [r for r in engine.runs() if r.id == run.id]
    finally:
        engine.close()
    assert (ended.state, ended.cancel_reason) == ("canceled", "password=*** pasted")
    shown = tools.cli(shop, "run", "show", run.id)
    assert "cancel asked by bob" in shown.stdout and "password=*** pasted" in shown.stdout
    assert PGPW not in shown.stdout + shown.stderr
