"""``combined demo``: it replaces only a directory an earlier demo made."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from combined.demo import DEMO_PROJECT, MARKER
from combined.engine import Engine


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_demo_runs_twice_in_a_row_in_its_default_directory(tmp_path: Path, tools: Any) -> None:
    bin_dir = Path(sys.executable).parent
    activate = os.path.relpath(bin_dir / "activate", tmp_path)
    without = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not p or Path(p) != bin_dir
    )
    for attempt, path, hint in (
        # Not on the PATH (a shell after `make demo`): the hint activates the venv first.
        (0, without, f"try: source {activate} && cd demo && combined sql"),
        (1, f"{bin_dir}{os.pathsep}{without}", "try: cd demo && combined sql"),
    ):
        result = tools.cli(tmp_path, "demo", env={"PATH": path})
        assert result.returncode == 0, (attempt, result.stdout, result.stderr)
        assert hint in result.stdout
    assert (tmp_path / "demo" / MARKER).is_file()
    engine = Engine.open(tmp_path / "demo" / "combined.yaml")
    try:
        assert len(engine.runs()) == 2  # the second demo started afresh
    finally:
        engine.close()
    # a demo made before the marker (its project file the demo's, unchanged) is replaced too
    (tmp_path / "demo" / MARKER).unlink()
    again = tools.cli(tmp_path, "demo")
    assert again.returncode == 0, again.stderr
    (tmp_path / "demo" / MARKER).unlink()
    (tmp_path / "demo" / "combined.yaml").write_text(DEMO_PROJECT + "# mine now\n")
    edited = tools.cli(tmp_path, "demo")
    assert edited.returncode == 2, edited.stdout
    assert (tmp_path / "demo" / "combined.yaml").read_text().endswith("# mine now\n")


def test_the_demo_refuses_a_directory_it_did_not_make(shop: Path, tools: Any) -> None:
    captured = tools.cli(shop, "capture")
    assert captured.returncode == 0, captured.stderr
    before = _tree(shop)
    assert any(name.startswith("lake/_deliveries/") for name in before)
    for directory, cwd in ((str(shop), shop.parent), (".", shop)):
        result = tools.cli(cwd, "demo", "--directory", directory)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert "already exists and was not made by `combined demo`" in result.stderr
        assert "pick another directory with --directory, or remove it yourself" in result.stderr
        assert _tree(shop) == before  # nothing deleted


def test_the_demo_uses_an_empty_directory_and_refuses_a_file(tmp_path: Path, tools: Any) -> None:
    (tmp_path / "[bold]empty").mkdir()  # the name is printed as written, not as markup
    used = tools.cli(tmp_path, "demo", "--directory", "[bold]empty")
    assert used.returncode == 0, used.stderr
    assert "1. a sample shop in [bold]empty/shop.db" in used.stdout
    assert (tmp_path / "[bold]empty" / "shop.db").is_file()

    (tmp_path / "notes.txt").write_text("mine")
    refused = tools.cli(tmp_path, "demo", "--directory", "notes.txt")
    assert refused.returncode == 2, refused.stderr
    assert "notes.txt already exists and is not a directory" in refused.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"
