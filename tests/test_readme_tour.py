"""The README's tour runs as written, in order, from an empty directory.

The test reads the tour from README.md itself, so a command changed there
that no longer runs, or a step left out (``cd demo``), fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(section: str) -> list[str]:
    """The ``sh`` code blocks of a README section, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"^```sh\n(.*?)^```$", body, flags=re.DOTALL | re.MULTILINE)


def test_the_readme_starts_with_exactly_the_two_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first = re.search(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    assert first is not None and text.index(first.group(0)) < text.index("\n## ")
    commands = [line.split("#", 1)[0].strip() for line in first.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    # ... and how to reach `combined` once they ran, before the tour.
    intro = text[: text.index("\n## ")]
    assert "source .venv/bin/activate" in intro and ".venv/bin/combined" in intro


@pytest.mark.skipif(shutil.which("bash") is None, reason="the tour is a shell session")
def test_every_command_of_the_tour_runs_as_written(tmp_path: Path) -> None:
    tour = _blocks("A short tour")[0]
    assert tour.startswith("combined demo") and "\ncd demo " in tour
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "combined").is_file(), "the combined script is installed with the package"
    env = {
        **os.environ,
        # As after `source .venv/bin/activate`: this installation's command first.
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "COMBINED_RETRY_BACKOFF_S": "0",
    }
    env.pop("COMBINED_PROJECT", None)
    script = "set -euo pipefail\nset -x\n" + tour
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    # What the tour promises happened: the enqueued run was executed, the
    # project of `init` is where it says, and the JSON is JSON.
    assert (tmp_path / "mine" / "combined.yaml").is_file()
    assert (tmp_path / "mine" / "combined.schema.json").is_file()
    runs_json = [line for line in result.stdout.splitlines() if line.startswith('[{"id": "r')]
    runs = json.loads(runs_json[-1])
    assert runs[0]["trigger"] == "manual" and all(r["state"] == "succeeded" for r in runs)
    assert len(runs) == 4  # the demo's two, `capture`, and the queued one the worker ran
