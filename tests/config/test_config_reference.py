"""The JSON Schema of combined.yaml and docs/configuration.md: from the models, never stale."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from combined.config import EXAMPLE_PROJECT, load_project, write_example
from combined.config._reference import SCHEMA_FILE, json_schema, reference_markdown, schema_text
from combined.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _validator() -> jsonschema.protocols.Validator:
    schema = json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _errors(document: Any) -> list[str]:
    return [e.message for e in _validator().iter_errors(document)]


def test_the_committed_schema_is_the_generated_one() -> None:
    committed = (REPO / "schema" / "combined.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(), "schema/combined.schema.json is stale: run `make schema`"


def test_the_committed_reference_is_the_generated_one() -> None:
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), "docs/configuration.md is stale: run `make schema`"


def test_the_reference_gives_the_keys_a_new_user_asks_about() -> None:
    text = reference_markdown()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)}
    assert "`65536`" in rows["batch_rows"] and "`256MiB`" in rows["reduction_memory"]
    assert "the dataset's name" in rows["relation"]
    assert "unset" in rows["freshness"] and "never stale" in rows["freshness"]
    assert "column name or list" in rows["columns"]
    assert "[delivery](#delivery)" in rows["delivery"] and "`64MiB`" in rows["max_bytes"]
    assert "`full_refresh` needs it too" in rows["key"]
    # Every field of every model has its row: none is left out of the reference.
    from combined.config._reference import _SECTIONS

    for _, model, _ in _SECTIONS:
        for name in model.model_fields:
            assert f"| `{name}` |" in text, (model.__name__, name)


def test_the_schema_accepts_the_example_and_every_commented_source() -> None:
    assert _errors(yaml.safe_load(EXAMPLE_PROJECT)) == []
    uncommented = re.sub(
        r"^#(  .*)$", r"\1", EXAMPLE_PROJECT.split("# BEGIN", 1)[1], flags=re.MULTILINE
    )
    body = "sources:\n" + "\n".join(
        line for line in uncommented.splitlines() if line.startswith("  ")
    )
    document = yaml.safe_load(EXAMPLE_PROJECT) | {"sources": yaml.safe_load(body)["sources"]}
    assert set(document["sources"]) >= {"crm", "billing", "github", "gh", "api", "exports"}
    assert _errors(document) == []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"lake": "./lake", "stagin": {}}, "stagin"),  # a misspelt key
        ({"reduction_memory": "lots"}, "lots"),
        ({"sources": {"Shop": {"connector": "sqlite"}}}, "Shop"),  # not a valid name
        ({"sources": {"s": {"connector": "sqlite", "datasets": {"d": {"strategy": "x"}}}}}, "x"),
        ({"sources": {"s": {"connector": "sqlite", "datasets": {"d": {"freshness": 5}}}}}, "5"),
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    document = {"version": 1, **change}
    assert any(words in e for e in _errors(document)), _errors(document)
    (tmp_path / "combined.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError):
        load_project(tmp_path)


def test_a_dataset_without_relation_or_with_stream_is_valid() -> None:
    source = {"connector": "singer", "datasets": {"a": {"key": "id"}, "b": {"stream": "x"}}}
    assert _errors({"version": 1, "sources": {"s": source}}) == []


def test_init_writes_the_schema_its_first_line_names(tmp_path: Path) -> None:
    project = write_example(tmp_path / "combined.yaml")
    first = project.read_text().splitlines()[0]
    assert first == f"# yaml-language-server: $schema=./{SCHEMA_FILE}"
    written = tmp_path / SCHEMA_FILE
    assert json.loads(written.read_text()) == json_schema()


def test_the_schema_command_prints_and_writes_it(tmp_path: Path) -> None:
    def combined(*args: str) -> subprocess.CompletedProcess[str]:
        code = "from combined.cli import main; main()"
        return subprocess.run(
            [sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True
        )

    printed = combined("schema")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == schema_text()
    written = combined("schema", "--reference", "-o", "ref.md")
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "ref.md").read_text() == reference_markdown()
    version = combined("--version")
    assert version.returncode == 0 and re.fullmatch(r"combined \d+\.\d+\.\d+\S*\n", version.stdout)


def test_init_into_a_directory_not_made_yet(tmp_path: Path) -> None:
    project = write_example(tmp_path / "mine")
    assert project == tmp_path / "mine" / "combined.yaml" and project.is_file()
    assert (tmp_path / "mine" / SCHEMA_FILE).is_file()
    assert write_example(tmp_path / "other.yml") == tmp_path / "other.yml"  # a file, as named
