"""The public Python API: its names, its lazy import, and docs/python.md's examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import make_shop

import combined

DOC = Path(__file__).parent.parent / "docs" / "python.md"


def test_every_public_name_imports_and_none_loads_the_engine_before_use() -> None:
    """``import combined`` stays instant: nothing heavy is imported until a name is used."""
    probe = (
        "import sys, combined; "
        "print(sorted(m for m in ('combined.engine', 'duckdb', 'deltalake') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for name in combined.__all__:
        assert getattr(combined, name) is not None, name
    with pytest.raises(AttributeError):
        combined.NoSuchName  # noqa: B018


@pytest.mark.parametrize(
    ("states", "status"),
    [
        ([], 0),
        (["succeeded"], 0),
        (["succeeded", "failed"], combined.RUN_FAILED),
        (["failed", "needs_review"], combined.RUN_NEEDS_REVIEW),
        (["needs_review", "needs_auth", "failed"], combined.RUN_NEEDS_AUTH),
        (["canceled"], combined.RUN_FAILED),
    ],
)
def test_exit_status_ranks_what_needs_a_person_first(states: list[str], status: int) -> None:
    assert combined.exit_status(states) == status


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_first_example_of_the_python_docs_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_shop(tmp_path)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(_python_blocks()[0], scope)  # noqa: S102 - the documented example, verbatim
    assert scope["status"] == 0
    table = scope["table"]
    assert table.to_pylist() == [{"n": 200}]  # type: ignore[attr-defined]
    assert "succeeded" in capsys.readouterr().out


@pytest.mark.parametrize("example", ["dagster_capture.py", "airflow_capture.py"])
def test_the_orchestrator_examples_are_in_the_python_docs_verbatim(example: str) -> None:
    """What docs/python.md shows is the file tests/orchestrators runs with Dagster or Airflow."""
    text = (DOC.parent.parent / "examples" / example).read_text()
    assert text in _python_blocks()
    assert f"`examples/{example}`" in DOC.read_text()
