"""The example project that ``combined init`` writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from combined.config import EXAMPLE_PROJECT, find_secret_refs, load_project, write_example
from combined.errors import ConfigError


def test_example_loads_with_the_documented_datasets(tmp_path: Path) -> None:
    project = load_project(write_example(tmp_path / "combined.yaml"))
    assert list(project.sources) == ["shop"]
    assert project.source("shop").connector == "sqlite"
    orders = project.dataset("shop", "orders")
    events = project.dataset("shop", "events")
    assert (orders.strategy, orders.sync_mode, orders.key) == ("snapshot", "incremental", ["id"])
    assert (events.strategy, events.sync_mode) == ("cursor", "append")
    assert events.cursor is not None and events.cursor.column == "id"
    assert project.lake_uri() == str(tmp_path / "lake")


def test_commented_postgres_source_loads_once_uncommented(tmp_path: Path) -> None:
    block = re.search(
        r"^# BEGIN postgres example\n(.*?)^# END postgres example\n",
        EXAMPLE_PROJECT,
        flags=re.DOTALL | re.MULTILINE,
    )
    assert block is not None
    uncommented = "".join(line[1:] + "\n" for line in block.group(1).splitlines())
    text = EXAMPLE_PROJECT.replace(block.group(0), uncommented)
    (tmp_path / "combined.yaml").write_text(text)
    project = load_project(tmp_path)
    crm = project.source("crm")
    assert crm.connector == "postgres"
    assert find_secret_refs(crm.config) == [("password", "env:CRM_PASSWORD")]
    assert project.dataset("crm", "customers").strategy == "cdc"


def test_write_example_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "combined.yaml"
    path.write_text("mine\n")
    with pytest.raises(ConfigError) as info:
        write_example(path)
    assert str(path) in str(info.value)
    assert "--force" in (info.value.hint or "")
    assert path.read_text() == "mine\n"


def test_write_example_with_force_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "combined.yaml"
    path.write_text("mine\n")
    assert write_example(path, force=True) == path
    assert path.read_text() == EXAMPLE_PROJECT


def test_write_example_into_a_new_or_existing_directory(tmp_path: Path) -> None:
    assert write_example(tmp_path) == tmp_path / "combined.yaml"
    nested = write_example(tmp_path / "new" / "proj" / "combined.yaml")
    assert nested.read_text() == EXAMPLE_PROJECT
