"""Loading combined.yaml: round trip, defaults, and the errors a user sees."""

from __future__ import annotations

import os
import pickle
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from combined.config import (
    PROJECT_ENV,
    DriftPolicy,
    Project,
    load_project,
    parse_project,
)
from combined.errors import ConfigError, NotFoundError

FULL = """\
version: 1
lake: ./data/lake
catalog: postgresql://combined@db.example.com/combined
catalog_password: {secret: "env:CATALOG_PW"}
staging:
  max_bytes: 2GiB
  max_files: 500
  max_path_length: 200
  compression: zstd
reduction_memory: 256MiB
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
      password: {secret: "env:SHOP_PASSWORD"}
      options: {timeout: 5, tags: [a, b]}
    billing_policy: enterprise
    venue: worker
    datasets:
      orders:
        relation: main.orders
        key: [id]
        strategy: cursor
        sync_mode: incremental
        cursor:
          column: updated_at
          lookback: 5m
          trust: "application sets updated_at on every write"
        columns: [id, total, updated_at]
        delivery: {max_rows: 5000, max_bytes: 8MiB}
        batch_rows: 1024
        drift: {new_field: quarantine, widened_type: fail, narrowed_type: fail,
                rename: quarantine, drop: evolve}
        quarantine: {reader: "data-oncall", review_every: 3d}
        freshness: 1h30m
"""

MINIMAL = """\
version: 1
sources:
  shop:
    connector: sqlite
    datasets:
      orders:
        key: id
"""


def write(directory: Path, text: str, name: str = "combined.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(directory: Path, text: str) -> ConfigError:
    path = write(directory, text)
    with pytest.raises(ConfigError) as info:
        load_project(path)
    return info.value


@pytest.fixture(autouse=True)
def _no_project_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROJECT_ENV, raising=False)


def test_full_file_loads_with_every_value(tmp_path: Path) -> None:
    project = load_project(write(tmp_path, FULL))
    orders = project.dataset("shop", "orders")
    assert project.staging.max_bytes == 2 * 1024**3
    assert project.staging.compression == "zstd"
    assert project.reduction_memory == 256 * 1024**2
    assert project.catalog_password is not None
    assert project.catalog_password.secret == "env:CATALOG_PW"
    assert project.source("shop").venue == "worker"
    assert orders.relation == "main.orders"
    assert orders.cursor is not None
    assert orders.cursor.lookback == timedelta(minutes=5)
    assert orders.cursor.nulls == "fail"  # a NULL cursor is never silently left out
    assert orders.delivery.max_bytes == 8 * 1024**2
    assert orders.drift.drop == "evolve"
    assert orders.quarantine.review_every == timedelta(days=3)
    assert orders.freshness == timedelta(hours=1, minutes=30)


def test_dump_round_trips_through_yaml(tmp_path: Path) -> None:
    project = load_project(write(tmp_path, FULL))
    dumped = project.model_dump(mode="json")
    assert "path" not in dumped and "root" not in dumped
    assert dumped["sources"]["shop"]["datasets"]["orders"]["freshness"] == "1h30m"
    other = tmp_path / "copy"
    other.mkdir()
    again = load_project(write(other, yaml.safe_dump(dumped)))
    assert again.model_dump() == project.model_dump()
    assert again.root == other


def test_defaults(tmp_path: Path) -> None:
    project = load_project(write(tmp_path, MINIMAL))
    source = project.source("shop")
    orders = project.dataset("shop", "orders")
    assert project.lake == "./lake"
    assert project.catalog == "sqlite:///.combined/catalog.db"
    assert project.catalog_password is None
    assert (project.staging.max_bytes, project.staging.max_files) == (20 * 1024**3, 10_000)
    assert project.staging.max_path_length == 240
    assert project.staging.compression == "none"
    assert project.reduction_memory == 256 * 1024**2
    assert (source.config, source.billing_policy, source.venue) == ({}, "standard", "embedded")
    assert orders.relation == "orders"
    assert orders.key == ["id"]
    assert (orders.strategy, orders.sync_mode) == ("snapshot", "incremental")
    assert orders.cursor is None and orders.columns is None and orders.freshness is None
    assert (orders.delivery.max_rows, orders.delivery.max_bytes) == (100_000, 64 * 1024**2)
    assert orders.batch_rows == 65_536
    assert orders.drift == DriftPolicy(
        new_field="evolve", widened_type="evolve", narrowed_type="fail", rename="fail", drop="fail"
    )
    assert (orders.quarantine.reader, orders.quarantine.review_every) == ("owner", timedelta(7))


def test_path_and_root_are_the_file_and_its_directory(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    project = load_project(path)
    assert project.path == path
    assert project.root == tmp_path


def test_default_path_is_combined_yaml_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, MINIMAL)
    monkeypatch.chdir(tmp_path)
    assert load_project().path == tmp_path / "combined.yaml"


def test_env_var_overrides_default_but_not_an_explicit_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    chosen = write(tmp_path / "a", MINIMAL, name="prod.yaml")
    explicit = write(tmp_path / "b", MINIMAL)
    monkeypatch.chdir(tmp_path / "b")
    monkeypatch.setenv(PROJECT_ENV, str(chosen))
    assert load_project().path == chosen
    assert load_project(explicit).path == explicit


def test_a_directory_means_its_combined_yaml(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL)
    assert load_project(tmp_path).path == tmp_path / "combined.yaml"


def test_missing_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_project(tmp_path / "combined.yaml")
    assert str(tmp_path / "combined.yaml") in str(info.value)
    assert "combined init" in (info.value.hint or "")


def test_missing_file_named_by_env_var_mentions_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROJECT_ENV, str(tmp_path / "gone.yaml"))
    with pytest.raises(ConfigError) as info:
        load_project()
    assert "gone.yaml" in str(info.value)
    assert PROJECT_ENV in (info.value.hint or "")


@pytest.mark.parametrize(
    ("text", "position", "hint"),
    [
        ("version: 1\nlake: ./lake\n  bad: indent\n", "combined.yaml:3:6:", "indentation"),
        ("version: 1\nsources:\n\tshop: {}\n", "combined.yaml:3:1:", "tabs"),
        ("version: 1\nlake: a\nlake: b\n", "combined.yaml:3:1:", "only the last"),
        ("version: 1\nsources: [shop\n", "combined.yaml:3:1:", "indentation"),
    ],
)
def test_yaml_errors_give_file_line_and_column(
    tmp_path: Path, text: str, position: str, hint: str
) -> None:
    error = load_error(tmp_path, text)
    assert position in str(error)
    assert "invalid YAML" in str(error)
    assert hint in (error.hint or "")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just text\n"])
def test_a_file_without_settings_is_refused(tmp_path: Path, text: str) -> None:
    error = load_error(tmp_path, text)
    assert "combined.yaml" in str(error)
    assert error.hint


def source(**dataset: Any) -> dict[str, Any]:
    """A project whose one dataset, shop.orders, has the given settings."""
    body = {"key": ["id"], **dataset}
    return {
        "version": 1,
        "sources": {"shop": {"connector": "sqlite", "datasets": {"orders": body}}},
    }


def with_config(**config: Any) -> dict[str, Any]:
    project = source()
    project["sources"]["shop"]["config"] = config
    return project


ORDERS = "sources.shop.datasets.orders"

BAD_INPUTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("no version", {"sources": {}}, "version", "is required"),
    ("future version", {"version": 2}, "version", "version 1"),
    ("quoted version", {"version": "1"}, "version", "the number 1, unquoted"),
    ("lake scheme", {"version": 1, "lake": "ftp://host/lake"}, "lake", "ftp://"),
    ("bucketless lake", {"version": 1, "lake": "s3://"}, "lake", "bucket"),
    # the Delta log under `pct x/`, the data under `pct%20x/`; a table made at s3://bucket/a
    ("escaped lake", {"version": 1, "lake": "s3://bucket/pct%20x"}, "lake", "holds '%'"),
    ("lake query", {"version": 1, "lake": "s3://bucket/a?b=c"}, "lake", "holds '?'"),
    ("lake fragment", {"version": 1, "lake": "file:///data/h#frag"}, "lake", "holds '#'"),
    # (a credential is told as one, not as a '%' to rename)
    ("lake key", {"version": 1, "lake": "s3://key:p%40ss@bucket/l"}, "lake", "credential"),
    ("catalog scheme", {"version": 1, "catalog": "mysql://h/db"}, "catalog", "mysql://"),
    (
        "catalog driver",
        {"version": 1, "catalog": "sqlite+foo:///x.db"},
        "catalog",
        "unsupported driver: sqlite+foo://",
    ),
    (
        "catalog driver not used",
        {"version": 1, "catalog": "postgresql+psycopg2://u@h/db"},
        "catalog",
        "chooses the driver",
    ),
    ("catalog port", {"version": 1, "catalog": "postgres://u@h:abc/db"}, "catalog", "'abc'"),
    (
        "catalog password",
        {"version": 1, "catalog": "postgresql://u:hunter2@h/db"},
        "catalog",
        "catalog_password",
    ),
    (
        "literal catalog password",
        {"version": 1, "catalog": "postgresql://u@h/db", "catalog_password": "hunter2"},
        "catalog_password",
        "literal secret",
    ),
    (
        "catalog password for sqlite",
        {"version": 1, "catalog_password": {"secret": "env:PW"}},
        "catalog_password",
        "postgresql",
    ),
    ("staging size", {"version": 1, "staging": {"max_bytes": "lots"}}, "staging.max_bytes", "MiB"),
    ("staging count", {"version": 1, "staging": {"max_files": 0}}, "staging.max_files", "above"),
    ("reduction memory", {"version": 1, "reduction_memory": "5XB"}, "reduction_memory", "MiB"),
    (
        "staging codec",
        {"version": 1, "staging": {"compression": "gzip"}},
        "staging.compression",
        "lz4",
    ),
    ("staging not a mapping", {"version": 1, "staging": 5}, "staging", "mapping"),
    (
        "source name",
        {"version": 1, "sources": {"Shop": {"connector": "x"}}},
        "sources.Shop",
        "'shop'",
    ),
    (
        "dataset name",
        {"version": 1, "sources": {"shop": {"connector": "x", "datasets": {"1st": {"key": "id"}}}}},
        "sources.shop.datasets.1st",
        "'_1st'",
    ),
    (
        "no connector",
        {"version": 1, "sources": {"shop": {}}},
        "sources.shop.connector",
        "add `connector:",
    ),
    # (the hint said `connector: sqlite`, whatever the source's dsn named)
    (
        "no connector, which",
        {"version": 1, "sources": {"shop": {}}},
        "sources.shop.connector",
        "add `connector: NAME` under sources.shop, NAME one of airbyte, files, http, mariadb",
    ),
    (
        "a dataset's setting indented as a dataset",
        {"version": 1, "sources": {"shop": {"connector": "x", "datasets": {"o": {}, "key": [1]}}}},
        "sources.shop.datasets.key",
        "'key' reads as an entry of sources.shop.datasets named 'key'; if it is a setting of "
        "the entry above it, indent it under that entry",
    ),
    (
        "a source's setting indented as a source",
        {"version": 1, "sources": {"shop": {"connector": "x"}, "config": "y"}},
        "sources.config",
        "indent it under that entry",
    ),
    ("no key", source(key=None), f"{ORDERS}.key", "sync_mode: append"),
    ("no key, the keyless fix", source(key=None), f"{ORDERS}.key", "`key: []` for a table"),
    (
        "keyless cursor",
        source(key=[], strategy="cursor", cursor={"column": "id", "trust": "t"}),
        f"{ORDERS}.key",
        "needs strategy snapshot, not cursor",
    ),
    ("keyless cdc", source(key=[], strategy="cdc"), f"{ORDERS}.key", "not cdc"),
    (
        "append cdc without a key",
        source(key=None, strategy="cdc", sync_mode="append"),
        f"{ORDERS}.key",
        "required when strategy is cdc",
    ),
    (
        "append cdc, key []",
        source(key=[], strategy="cdc", sync_mode="append"),
        f"{ORDERS}.key",
        "REPLICA IDENTITY FULL",
    ),
    ("keyless history", source(key=[], history=True), f"{ORDERS}.history", "a new row"),
    ("keyless deletes", source(key=[], deletes={"flag": "gone"}), f"{ORDERS}.deletes", "key []"),
    ("repeated key", source(key=["id", "id"]), f"{ORDERS}.key", "twice"),
    ("blank key column", source(key=["id", " "]), f"{ORDERS}.key[1]", "column name"),
    ("strategy", source(strategy="snapshots"), f"{ORDERS}.strategy", "did you mean 'snapshot'"),
    ("sync mode", source(sync_mode="merge"), f"{ORDERS}.sync_mode", "full_refresh"),
    ("cursor missing", source(strategy="cursor"), f"{ORDERS}.cursor", "is required"),
    (
        "cursor not used",
        source(cursor={"column": "id", "trust": "t"}),
        f"{ORDERS}.cursor",
        "strategy: cursor",
    ),
    (
        "cursor trust",
        source(strategy="cursor", cursor={"column": "id"}),
        f"{ORDERS}.cursor.trust",
        "add `trust:",
    ),
    (
        "cursor lookback",
        source(strategy="cursor", cursor={"column": "id", "lookback": "soon", "trust": "t"}),
        f"{ORDERS}.cursor.lookback",
        "duration",
    ),
    (
        "negative lookback",
        source(strategy="cursor", cursor={"column": "id", "lookback": -1, "trust": "t"}),
        f"{ORDERS}.cursor.lookback",
        "negative",
    ),
    (
        # Rows of the lookback window are read again every run: an append
        # stream kept each of them once more (5 of 10 events twice).
        "append of a lookback",
        source(
            strategy="cursor",
            sync_mode="append",
            cursor={"column": "id", "lookback": 5, "trust": "t"},
        ),
        f"{ORDERS}.cursor.lookback",
        "sync_mode: incremental",
    ),
    (
        # Rows with a NULL cursor are read again every run: an append stream
        # would keep each of them once more per capture.
        "append of null cursors",
        source(
            strategy="cursor",
            sync_mode="append",
            cursor={"column": "id", "trust": "t", "nulls": "include"},
        ),
        f"{ORDERS}.cursor.nulls",
        "sync_mode: incremental",
    ),
    (
        "cursor nulls",
        source(strategy="cursor", cursor={"column": "id", "trust": "t", "nulls": "keep"}),
        f"{ORDERS}.cursor.nulls",
        "include",
    ),
    (
        "full refresh of a cursor",
        source(strategy="cursor", sync_mode="full_refresh", cursor={"column": "id", "trust": "t"}),
        f"{ORDERS}.sync_mode",
        "strategy: snapshot",
    ),
    ("projection without key", source(columns=["total"]), f"{ORDERS}.columns", "'id'"),
    ("delivery size", source(delivery={"max_bytes": "big"}), f"{ORDERS}.delivery.max_bytes", "MiB"),
    (
        "delivery rows bool",
        source(delivery={"max_rows": True}),
        f"{ORDERS}.delivery.max_rows",
        "whole number",
    ),
    ("batch rows", source(batch_rows=-1), f"{ORDERS}.batch_rows", "above zero"),
    ("drift outcome", source(drift={"drop": "ignore"}), f"{ORDERS}.drift.drop", "quarantine"),
    (
        "review cadence",
        source(quarantine={"review_every": "weekly"}),
        f"{ORDERS}.quarantine.review_every",
        "1d",
    ),
    ("freshness number", source(freshness=5), f"{ORDERS}.freshness", "without a unit"),
    (
        "literal password",
        with_config(password="hunter2"),
        "sources.shop.config.password",
        "literal secret",
    ),
    (
        "literal numeric token",
        with_config(token=12345),
        "sources.shop.config.token",
        "literal secret",
    ),
    (
        "literal secret in a list",
        with_config(hosts=[{"api_key": "hunter2"}]),
        "sources.shop.config.hosts[0].api_key",
        "literal secret",
    ),
    (
        "dsn with password",
        with_config(dsn="postgresql://me:hunter2@db/x"),
        "sources.shop.config.dsn",
        "password:",
    ),
    (
        "conninfo with password",
        with_config(dsn="host=db password=hunter2"),
        "sources.shop.config.dsn",
        "password:",
    ),
    (
        "malformed reference",
        with_config(password={"secret": "hunter2"}),
        "sources.shop.config.password.secret",
        "env:NAME",
    ),
    (
        "bad env name",
        with_config(password={"secret": "env:1BAD"}),
        "sources.shop.config.password.secret",
        "environment variable",
    ),
    (
        "mixed reference",
        with_config(password={"secret": "env:PW", "user": "me"}),
        "sources.shop.config.password",
        "mixes",
    ),
]


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_names_file_and_dotted_path(
    tmp_path: Path, data: dict[str, Any], path: str, fragment: str
) -> None:
    error = load_error(tmp_path, yaml.safe_dump(data))
    text = error.describe()
    assert str(tmp_path / "combined.yaml") in str(error)
    assert f": {path} " in str(error), text
    assert fragment in text
    assert error.hint
    assert "hunter2" not in text + repr(error.context)


def test_unknown_key_suggests_the_closest_known_key(tmp_path: Path) -> None:
    error = load_error(tmp_path, MINIMAL.replace("key: id", "key: id\n        sync_mod: append"))
    assert f"{ORDERS}.sync_mod is not a known key" in str(error)
    assert "did you mean 'sync_mode'?" in (error.hint or "")


def test_unknown_key_without_a_close_match_lists_known_keys(tmp_path: Path) -> None:
    error = load_error(tmp_path, "version: 1\nzzz: 1\n")
    assert "combined.yaml:2:1: zzz is not a known key" in str(error)
    assert "did you mean" not in (error.hint or "")
    assert "reduction_memory" in (error.hint or "")


def test_several_problems_come_as_one_error_with_a_line_each(tmp_path: Path) -> None:
    text = MINIMAL + "        strategy: snapshots\n        batch_rows: 0\nlakes: x\n"
    error = load_error(tmp_path, text)
    lines = str(error).splitlines()
    assert "3 problems" in lines[0]
    problems = error.context["problems"]
    assert isinstance(problems, list)
    assert [p["path"] for p in problems] == [
        f"{ORDERS}.strategy",
        f"{ORDERS}.batch_rows",
        "lakes",
    ]
    assert sum("hint:" in line for line in lines) == 3
    assert ":8:9:" in lines[1] and ":9:9:" in lines[3] and ":10:1:" in lines[5]


def test_config_error_survives_pickling(tmp_path: Path) -> None:
    error = load_error(tmp_path, "version: 1\nzzz: 1\n")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.describe() == error.describe()
    assert copy.context == error.context


def test_dates_in_connector_config_stay_text(tmp_path: Path) -> None:
    text = MINIMAL.replace("    datasets:", "    config: {start: 2024-01-01}\n    datasets:")
    assert load_project(write(tmp_path, text)).source("shop").config == {"start": "2024-01-01"}


def test_unknown_source_and_dataset_list_known_names(tmp_path: Path) -> None:
    project = load_project(write(tmp_path, MINIMAL))
    with pytest.raises(NotFoundError) as info:
        project.source("shopp")
    assert "shopp" in str(info.value) and "shop" in (info.value.hint or "")
    with pytest.raises(NotFoundError) as info:
        project.dataset("shop", "order")
    assert "'order'" in str(info.value) and "orders" in (info.value.hint or "")


def test_datasets_are_listed_in_file_order(tmp_path: Path) -> None:
    text = MINIMAL + "      events:\n        sync_mode: append\n"
    names = [(s, d) for s, d, _ in load_project(write(tmp_path, text)).datasets()]
    assert names == [("shop", "orders"), ("shop", "events")]


def test_local_lake_is_absolute_against_the_project_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = load_project(write(tmp_path, MINIMAL))
    monkeypatch.chdir("/")
    assert project.lake_uri() == str(tmp_path / "lake")


def test_object_store_lake_is_kept_as_written(tmp_path: Path) -> None:
    project = parse_project({"version": 1, "lake": "s3://bucket/lake/"}, tmp_path / "p.yaml")
    assert project.lake_uri() == "s3://bucket/lake"


def test_sqlite_catalog_resolves_against_root_without_creating_it(tmp_path: Path) -> None:
    project = load_project(write(tmp_path, MINIMAL))
    url = project.catalog_url()
    assert url == f"sqlite:///{tmp_path}/.combined/catalog.db"
    assert url.startswith("sqlite:////")
    assert not (tmp_path / ".combined").exists()


def test_sqlite_catalog_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("not a directory")
    project = parse_project(
        {"version": 1, "catalog": "sqlite:///blocker/catalog.db"}, tmp_path / "combined.yaml"
    )
    with pytest.raises(ConfigError) as info:
        project.catalog_url()
    assert "blocker" in str(info.value)


@pytest.mark.parametrize(
    "catalog",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:////var/lib/c.db",
        "sqlite+pysqlite:////var/lib/c.db",
        "postgresql://u@h:5432/db",
        "postgres://u@h/db",
        "postgresql+psycopg://u@h/db",
    ],
)
def test_other_catalog_urls_are_kept(tmp_path: Path, catalog: str) -> None:
    project = parse_project({"version": 1, "catalog": catalog}, tmp_path / "combined.yaml")
    assert project.catalog_url() == catalog
    assert project.catalog_kind == ("sqlite" if catalog.startswith("sqlite") else "postgresql")


def test_catalog_password_is_resolved_from_its_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CATALOG_PW", "pg-pass")
    project = load_project(write(tmp_path, FULL))
    assert project.catalog_kind == "postgresql"
    assert project.catalog_secret() == "pg-pass"
    assert "pg-pass" not in project.catalog_url()


def test_resolved_config_substitutes_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_PASSWORD", "shop-pass")
    project = load_project(write(tmp_path, FULL))
    resolved = project.resolved_config("shop")
    assert resolved["password"] == "shop-pass"
    assert project.source("shop").config["password"] == {"secret": "env:SHOP_PASSWORD"}


def test_parse_project_reports_like_load_project(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_project(source(strategy="cursor"), tmp_path / "combined.yaml")
    assert f"combined.yaml: {ORDERS}.cursor is required" in str(info.value)


def test_project_built_directly_lives_in_cwd(tmp_path: Path) -> None:
    assert Project(version=1).path == Path(os.getcwd()) / "combined.yaml"


def test_keys_are_the_text_written_not_yaml_booleans_or_numbers(tmp_path: Path) -> None:
    # YAML 1.1 reads an unquoted on, yes, no, true or null as a boolean or
    # nothing; every key of the project file is a name, so it stays as written.
    text = """\
    version: 1
    sources:
      yes:
        connector: sqlite
        config: {1: one}
        datasets:
          on: {key: id}
          true: {key: [id], relation: orders}
          null: &base {key: id, relation: orders}
          off:
            <<: *base
            relation: items
    """
    project = load_project(write(tmp_path, text))
    assert list(project.sources) == ["yes"]
    datasets = project.source("yes").datasets
    assert list(datasets) == ["on", "true", "null", "off"]
    assert datasets["on"].relation == "on" and datasets["true"].relation == "orders"
    assert datasets["off"].relation == "items" and datasets["off"].key == ["id"]
    assert project.source("yes").config == {"1": "one"}


def test_a_key_written_twice_in_two_spellings_is_refused(tmp_path: Path) -> None:
    error = load_error(
        tmp_path, MINIMAL.replace("      orders:", '      "on": {key: id}\n      on:')
    )
    assert "combined.yaml:7:7: invalid YAML: duplicate key 'on'" in str(error)


def test_a_yaml_boolean_where_a_name_belongs_says_to_quote_it(tmp_path: Path) -> None:
    error = load_error(tmp_path, MINIMAL.replace("key: id", "key: [no]\n        relation: off"))
    assert "combined.yaml:7:15: sources.shop.datasets.orders.key[0] must be a column" in str(error)
    assert "combined.yaml:8:9: sources.shop.datasets.orders.relation must be" in str(error)
    for problem in error.context["problems"]:
        assert problem["hint"].startswith("quote it: YAML reads an unquoted yes, no, on"), problem


@pytest.mark.parametrize("sync_mode", ["incremental", "full_refresh", "append"])
def test_an_empty_key_declares_a_table_without_one(tmp_path: Path, sync_mode: str) -> None:
    # `key: []` is said on purpose: a forgotten key is still refused (above).
    project = load_project(write(tmp_path, yaml.safe_dump(source(key=[], sync_mode=sync_mode))))
    assert project.dataset("shop", "orders").key == []
