"""The project's id, kept in its lake: one id for every process, made once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from combined.lake import LakeLayout
from combined.lake._project import project_id

#: argv: lake, go file. Asks for the project's id once the go file exists.
ASKER = """
import os, sys, time
from combined.lake import LakeLayout
from combined.lake._project import project_id
lake, go = sys.argv[1:3]
while not os.path.exists(go):
    time.sleep(0.01)
print(project_id(LakeLayout(lake)))
"""


@pytest.mark.parametrize("lake_url", ["local", "s3"], indirect=True)
def test_processes_that_make_the_id_at_once_agree_on_one(
    tmp_path: Path, lake_url: str, request: pytest.FixtureRequest
) -> None:
    if lake_url.startswith("s3://"):
        request.getfixturevalue("s3_faults")  # (moto's conditional create, made atomic)
    lake = str(tmp_path / "lake") if lake_url == "./lake" else lake_url
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", ASKER, lake, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    time.sleep(1.0)  # all imported and waiting
    go.touch()
    ids = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        ids.append(out.strip())
    assert len(set(ids)) == 1 and len(ids[0]) == 32, ids
    assert project_id(LakeLayout(lake)) == ids[0]  # and it stays the project's


def test_another_lake_is_another_project(tmp_path: Path) -> None:
    one = project_id(LakeLayout(tmp_path / "one"))
    assert project_id(LakeLayout(tmp_path / "two")) != one
    assert project_id(LakeLayout(tmp_path / "one")) == one


def test_a_table_made_while_it_is_looked_up_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table whose first entry lands between its load and the question whether it
    exists is read, not refused.

    Before, the load's "No files in log segment" was raised as the table's
    read failure: of three processes asking for the project's id at once,
    one failed so on a loaded machine.
    """
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    made = tmp_path / "lake" / "_combined" / "project"
    theirs = "a" * 32
    asked = DeltaTable.is_deltatable

    def landing(path: str, storage_options: dict[str, str] | None = None) -> bool:
        if not (made / "_delta_log").exists():  # (the other process's commit lands now)
            write_deltalake(str(made), pa.table({"id": [theirs]}))
        return asked(path, storage_options=storage_options)

    monkeypatch.setattr(DeltaTable, "is_deltatable", staticmethod(landing))
    assert project_id(LakeLayout(tmp_path / "lake")) == theirs
