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


@pytest.mark.parametrize(
    ("example", "source", "connector", "secret", "dataset", "strategy"),
    [
        ("postgres", "crm", "postgres", ("password", "env:CRM_PASSWORD"), "customers", "cdc"),
        (
            "mariadb",
            "billing",
            "mariadb",
            ("password", "env:BILLING_PASSWORD"),
            "payments",
            "cursor",
        ),
        (
            "singer",
            "github",
            "singer",
            ("config.auth_token", "env:GITHUB_TOKEN"),
            "issues",
            "cursor",
        ),
        (
            "airbyte",
            "gh",
            "airbyte",
            ("config.credentials.personal_access_token", "env:GITHUB_TOKEN"),
            "issues",
            "cursor",
        ),
        ("http", "api", "http", ("auth.token", "env:API_TOKEN"), "orders", "cursor"),
    ],
)
def test_a_commented_source_loads_once_uncommented(
    tmp_path: Path,
    example: str,
    source: str,
    connector: str,
    secret: tuple[str, str],
    dataset: str,
    strategy: str,
) -> None:
    from combined.connectors import check_config, connector_class, known_connectors

    if connector not in known_connectors():
        pytest.skip(f"the installed metadata predates the {connector} entry point: reinstall")
    block = re.search(
        rf"^# BEGIN {example} example\n(.*?)^# END {example} example\n",
        EXAMPLE_PROJECT,
        flags=re.DOTALL | re.MULTILINE,
    )
    assert block is not None
    uncommented = "".join(line[1:] + "\n" for line in block.group(1).splitlines())
    text = EXAMPLE_PROJECT.replace(block.group(0), uncommented)
    (tmp_path / "combined.yaml").write_text(text)
    project = load_project(tmp_path)
    found = project.source(source)
    assert found.connector == connector
    assert find_secret_refs(found.config) == [secret]
    check_config(connector_class(connector), found.config)  # the connector takes every key
    assert project.dataset(source, dataset).strategy == strategy


def test_the_files_example_loads_once_uncommented(tmp_path: Path) -> None:
    from combined.connectors import check_config, check_strategy, connector_class

    block = re.search(
        r"^# BEGIN files example\n(.*?)^# END files example\n",
        EXAMPLE_PROJECT,
        flags=re.DOTALL | re.MULTILINE,
    )
    assert block is not None
    uncommented = "".join(line[1:] + "\n" for line in block.group(1).splitlines())
    (tmp_path / "combined.yaml").write_text(EXAMPLE_PROJECT.replace(block.group(0), uncommented))
    project = load_project(tmp_path)
    found = project.source("exports")
    cls = connector_class("files")
    check_config(cls, found.config)
    for name, dataset in found.datasets.items():
        check_strategy(cls, dataset.strategy, where=name)
    cls(found.config).close()  # the declared types are ones DuckDB knows


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
