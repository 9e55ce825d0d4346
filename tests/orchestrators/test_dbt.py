"""dbt-duckdb reads a dataset at a publication's Delta version, as docs/readers.md says.

A real dbt project (dbt-core and dbt-duckdb in their own virtualenv,
``envs.py``: built on first use, minutes, then reused) over a lake that went
through two publications and a commit killed before its publication, so the
table's head is ahead of the newest publication; on disk and on a real
S3-compatible server on 127.0.0.1 (deltalake takes its credentials from the
environment). The ``delta`` plugin's source
at the newest publication's ``delta_version`` sees exactly what ``combined sql
--publication`` sees; at version 0 the plugin reads the head instead (it tests
the value's truth), and the Python model docs/readers.md gives for that case
reads version 0 itself. Everything through deltalake: no DuckDB extension.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.engine.test_readers import _published, _published_rows, _rows
from tests.orchestrators.envs import orchestrator_python

from combined import Engine

pytestmark = [pytest.mark.slow, pytest.mark.beside, pytest.mark.timeout(2400)]

PROFILES = """\
lake:
  target: dev
  outputs:
    dev:
      type: duckdb
      path: ./lake.duckdb
      plugins:
        - module: delta
"""

# Tables: the plugin's source is a view over an Arrow dataset registered for
# the run only, so a view over it would not read after the run.
PROJECT = """\
name: lake
version: "1.0"
profile: lake
models:
  lake:
    +materialized: table
"""

SOURCES = """\
sources:
  - name: shop
    meta:
      plugin: delta
    tables:
      - name: orders
        meta:
          delta_table_path: "{uri}"
          as_of_version: {version}
      - name: orders_at_zero
        meta:
          delta_table_path: "{uri}"
          as_of_version: 0
models:
  - name: first_orders
    config:
      table_uri: "{uri}"
      delta_version: 0
"""

# docs/readers.md's model for a version the plugin cannot take (0)
PYTHON_MODEL = """\
from deltalake import DeltaTable


def model(dbt, session):
    uri, version = dbt.config.get("table_uri"), dbt.config.get("delta_version")
    return DeltaTable(uri, version=version).to_pyarrow_dataset()
"""


def _dbt_project(root: Path, uri: str, version: int) -> Path:
    """A dbt project reading ``uri`` at ``version`` (and at 0, two ways)."""
    models = root / "models"
    models.mkdir(parents=True)
    (root / "profiles.yml").write_text(PROFILES)
    (root / "dbt_project.yml").write_text(PROJECT)
    (models / "sources.yml").write_text(SOURCES.format(uri=uri, version=version))
    select = "select id, status from {{{{ source('shop', '{}') }}}}\n"
    (models / "published_orders.sql").write_text(select.format("orders"))
    (models / "orders_at_zero.sql").write_text(select.format("orders_at_zero"))
    (models / "first_orders.py").write_text(PYTHON_MODEL)
    return root


def _dbt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    dbt = orchestrator_python("dbt").parent / "dbt"
    env = {"DBT_SEND_ANONYMOUS_USAGE_STATS": "false", "DBT_PROFILES_DIR": str(root)}
    done = subprocess.run(
        [str(dbt), *args],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, **env},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return done


def _show(root: Path, model: str) -> list[tuple[Any, ...]]:
    """The model's rows, as ``dbt show`` gives them, sorted."""
    inline = f"select id, status from {{{{ ref('{model}') }}}}"
    show = ("show", "--inline", inline, "--limit", "-1", "--output", "json", "--log-format", "json")
    done = _dbt(root, *show)
    for line in done.stdout.splitlines():
        event = json.loads(line)
        if event["info"]["name"] == "ShowNode":
            return sorted((r["id"], r["status"]) for r in json.loads(event["data"]["preview"]))
    raise AssertionError(f"dbt show printed no rows:\n{done.stdout[-3000:]}")


def test_dbt_duckdb_reads_exactly_what_a_publication_published(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    from deltalake import DeltaTable

    orchestrator_python("dbt")  # built first when missing (minutes), outside the timings below
    newest, first = _published(tmp_path / "combined", tools, lake_url)
    orders = newest["datasets"]["shop.orders"]
    uri, version = orders["table_uri"], orders["delta_version"]
    assert version > 0 and first["datasets"]["shop.orders"]["delta_version"] == 0
    head = _rows(DeltaTable(uri).to_pyarrow_table(columns=["id", "status"]))
    engine = Engine.open(tmp_path / "combined" / "combined.yaml")
    try:
        published = _published_rows(engine, newest["publication"])
        first_published = _published_rows(engine, first["publication"])
    finally:
        engine.close()
    assert "lost" in {s for _, s in head} and "lost" not in {s for _, s in published}

    root = _dbt_project(tmp_path / "dbt", uri, version)
    _dbt(root, "run")

    assert _show(root, "published_orders") == published != head
    # as_of_version: 0 is taken as unset: the plugin reads the head (docs/readers.md's
    # caution; when this fails, the plugin reads version 0 and the caution is stale)
    assert _show(root, "orders_at_zero") == head
    # the Python model reads version 0, the first publication
    assert _show(root, "first_orders") == first_published != published
