"""A staging limit breach fails the Run with a clear error and leaves the lake untouched."""

from __future__ import annotations

from pathlib import Path

from combined.engine import Engine


def test_a_staging_byte_limit_breach_fails_the_run_and_commits_nothing(
    tmp_path: Path, tools
) -> None:
    tools.make(tmp_path, orders=5000)
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text().replace("sources:", "staging:\n  max_bytes: 20KiB\nsources:")
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "failed"
        assert "over the limit of 20480" in (run.error or "")
        assert "staging.max_bytes" in (run.error or "")
        assert "staging.compression" in (run.error or "")
        assert not (tmp_path / "lake" / "shop" / "orders").exists()
        assert engine.publications() == []
        assert not (tmp_path / "lake" / "_staging" / run.id).exists()
    finally:
        engine.close()


def test_a_staging_file_limit_breach_fails_the_run(tmp_path: Path, tools) -> None:
    tools.make(tmp_path, orders=5000)
    project = tmp_path / "combined.yaml"
    text = project.read_text().replace("sources:", "staging:\n  max_files: 3\nsources:")
    text = text.replace(
        "      orders:\n        key: [id]\n",
        "      orders:\n        key: [id]\n        delivery: {max_rows: 500}\n",
    )
    project.write_text(text)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "failed"
        assert "files, over the limit of 3" in (run.error or "")
        assert not (tmp_path / "lake" / "shop" / "orders").exists()
    finally:
        engine.close()
