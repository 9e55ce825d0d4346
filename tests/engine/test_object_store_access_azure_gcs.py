"""An ``az://`` or ``gs://`` lake the store rejects: exit 2 before any Run, nothing written.

Against Azurite and fake-gcs-server on 127.0.0.1, each case with only its
store's usual variables set. Before these stores' errors were recognised, a
wrong Azure key read as a missing permission, a missing GCS bucket as "the
store refused the write", an unreadable GCS key file ended in a traceback,
and a machine without any Google credentials waited minutes for a metadata
server before failing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import runs as runs_repo
from combined.engine import Engine

#: A well-formed (base64) account key that is not Azurite's.
WRONG_KEY = "d3Jvbmcta2V5LXRoYXQtbXVzdC1uZXZlci1hcHBlYXI="

CASES = {
    "az no such container": ("az", "emulator", "its bucket or container does not exist"),
    "az wrong key": ("az", "wrong key", "the store refused the credentials"),
    "az no account": ("az", "none", "names no Azure storage account"),
    "gs no such bucket": ("gs", "emulator", "its bucket or container does not exist"),
    "gs unreadable key file": ("gs", "missing key file", "the store refused the credentials"),
    "gs no credentials": ("gs", "none", "no Google credentials were found"),
}

#: The variables of every store, none of which a case inherits.
STORE_PREFIXES = ("AWS_", "AZURE_", "AZURITE_", "GOOGLE_", "STORAGE_EMULATOR_", "CLOUDSDK_")


def _env(scheme: str, setting: str, request: Any, tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(STORE_PREFIXES)}
    clean["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud")  # no gcloud sign-in either
    if setting == "none":
        return clean
    if scheme == "gs":
        if setting == "missing key file":
            return clean | {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")}
        return clean | {"STORAGE_EMULATOR_HOST": request.getfixturevalue("fake_gcs")}
    from tests.conftest import azure_env

    env = clean | azure_env(request.getfixturevalue("azurite"))
    return env | ({"AZURE_STORAGE_ACCOUNT_KEY": WRONG_KEY} if setting == "wrong key" else {})


@pytest.mark.parametrize("case", list(CASES))
def test_a_rejected_lake_exits_2_before_any_run_and_writes_nothing(
    tmp_path: Path, tools: Any, case: str, request: Any
) -> None:
    scheme, setting, expected = CASES[case]
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    lake = f"{scheme}://missing-{uuid.uuid4().hex[:12]}/lake"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    done = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
        cwd=tmp_path,
        env=_env(scheme, setting, request, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert lake in done.stderr and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert WRONG_KEY not in done.stderr + done.stdout
    assert not (tmp_path / ".combined" / "staging").exists()
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            assert runs_repo.list_runs(conn, limit=10) == []
    finally:
        engine.close()
