"""Two Combined projects capturing one table of one database under one slot_prefix.

Both compute one slot name. The second's first capture took the first's
idle slot for the leftover of its own interrupted stand-up and dropped it:
the first's next capture found its slot gone. The publication now carries
its project's mark, and a slot is dropped only when that mark is its own.
"""

from __future__ import annotations

import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from combined.catalog import Run
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import ensure_publication
from combined.connectors.postgres._replication import create_slot, drop_slot, slot_status
from combined.engine import Engine
from combined.errors import ConfigError, SourceError
from combined.lake import LakeLayout, LakeTable
from combined.lake._project import project_id


@pytest.fixture
def two(tmp_path: Path, cdc_db: Any, tools: Any) -> tuple[Path, Path, str, str]:
    """Projects ``a`` and ``b``: one database, one table, one slot_prefix, two lakes."""
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 50) g")
    text = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id"])
    roots = tmp_path / "a", tmp_path / "b"
    for root in roots:
        root.mkdir()
        (root / "combined.yaml").write_text(text)
    return *roots, cdc_db.dsn, cdc_db.slot("public.items")


def _capture(root: Path) -> Run:
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        return run
    finally:
        engine.close()


def _lake(root: Path) -> list[tuple[Any, ...]]:
    engine = Engine.open(root / "combined.yaml")
    try:
        rows = engine.sql("SELECT id, v FROM pg.items ORDER BY id").to_pylist()
        return [(r["id"], r["v"]) for r in rows]
    finally:
        engine.close()


def _source(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute("SELECT id, v FROM items ORDER BY id"))


def _mark(dsn: str, slot: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
            (slot,),
        ).fetchone()
    return None if row is None else row[0]


def _refused(run: Run, *said: str) -> None:
    """A Run that failed saying ``said`` (what only the Run meets: a retry may help)."""
    assert run.state == "failed", run.error
    for words in said:
        assert words in (run.error or ""), run.error


def _turned_away(root: Path, *said: str) -> str:
    """A capture of ``root``'s project refused before any Run, as `combined check`
    refuses it, saying ``said``; what it said. No retry helps: it was a Run that
    failed, exit 1, "retry later"."""
    engine = Engine.open(root / "combined.yaml")
    try:
        before = engine.runs()
        with pytest.raises(ConfigError) as info:
            engine.capture()
        assert engine.runs() == before and engine.queued() == []
    finally:
        engine.close()
    told = f"{info.value.message} {info.value.hint}"
    for words in said:
        assert words in told, told
    return told


def _slot_since(dsn: str, slot: str) -> int | None:
    """The slot's restart position: a slot dropped and made again starts later."""
    return slot_status(Settings(dsn), slot).restart_lsn


def _interrupted(root: Path, dsn: str, slot: str, tools: Any) -> int:
    """Kill a first capture of ``root``'s project after it made its slot, before it
    committed; the slot's restart position."""
    killed = tools.cli(root, "capture", env={"COMBINED_FAULT": "after_staging"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert LakeTable(root / "lake" / "pg" / "items", "combined:pg/items").latest_commit() is None
    since = _slot_since(dsn, slot)
    assert since is not None  # the leftover: a slot, no commit
    return since


def _made_again(root: Path, dsn: str, slot: str, since: int) -> None:
    """The project's next capture drops its leftover slot, makes it again, and commits."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = 0 WHERE id = 1")
    assert _capture(root).state == "succeeded"
    assert (_slot_since(dsn, slot) or 0) > since  # dropped and made again
    assert _lake(root) == _source(dsn)


def test_a_second_project_is_refused_the_first_projects_slot(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    a, b, dsn, slot = two
    assert _capture(a).state == "succeeded"
    owner = project_id(LakeLayout(a / "lake"))
    since = _slot_since(dsn, slot)
    # The mark is the project's id: every role of the server may read it, and it
    # named the lake too (a local lake's absolute path).
    assert _mark(dsn, slot) == f"combined project {owner}"
    told = _turned_away(b, "another Combined project", owner, "`slot_prefix`")
    assert str(a / "lake") not in told
    # check, setup and teardown refuse it too, dropping nothing; a capture as check does,
    # before a Run, naming the slot, the project and database that have it, and the fix
    # (it was a Run that failed, exit 1, "retry later")
    database = conninfo_to_dict(dsn)["dbname"]
    argvs = (["capture"], ["check"], ["cdc", "setup", "pg"], ["cdc", "teardown", "pg", "--yes"])
    for argv in argvs:
        refused = tools.cli(b, *argv)
        out = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2, (argv, out)
        assert "another Combined project" in out and owner in out, (argv, out)
        assert f"'{slot}'" in out and f"database ({database!r})" in out, out
        assert "distinct `slot_prefix`" in out, out
    engine = Engine.open(b / "combined.yaml")
    try:
        assert engine.runs() == [] and engine.queued() == []  # (no Run: nothing to retry)
    finally:
        engine.close()
    assert _slot_since(dsn, slot) == since and owner in (_mark(dsn, slot) or "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = -v WHERE id <= 10")
    assert _capture(a).state == "succeeded"
    assert _lake(a) == _source(dsn)
    # The project's id is its lake's: a catalog rebuilt from the lake keeps it.
    shutil.rmtree(a / ".combined")
    assert tools.cli(a, "repair").returncode == 0
    setup = tools.cli(a, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    # The fix the refusal names: another slot_prefix for the second project.
    yaml = b / "combined.yaml"
    yaml.write_text(yaml.read_text().replace("slot_prefix: ", "slot_prefix: b_"))
    assert _capture(b).state == "succeeded"
    assert _lake(b) == _source(dsn)


def test_an_interrupted_first_capture_is_made_again_by_its_own_project_alone(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    a, b, dsn, slot = two
    since = _interrupted(a, dsn, slot, tools)
    _turned_away(b, "another Combined project")
    assert _slot_since(dsn, slot) == since
    _made_again(a, dsn, slot, since)


def test_a_slot_whose_publication_has_no_mark_is_refused_until_its_owner_is_told(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """What a capture before the marks left: an idle slot and a publication without a
    mark, whether one project's interrupted stand-up or another's live stream."""
    a, b, dsn, slot = two
    pg = Settings(dsn)
    ensure_publication(pg, slot, ["public.items"])
    create_slot(pg, slot).release_snapshot()
    since = _slot_since(dsn, slot)
    assert since is not None
    told = _turned_away(
        a, "carries no Combined project's mark", f"pg_drop_replication_slot('{slot}')"
    )
    teardown = tools.cli(a, "cdc", "teardown", "pg", "--yes")
    assert teardown.returncode == 2 and "no Combined project's mark" in teardown.stderr
    assert _slot_since(dsn, slot) == since
    # The hint's other way: the publication's owner marks it this project's.
    found = re.search(r"COMMENT ON PUBLICATION \S+ IS '(?:[^']|'')*'", told)
    assert found is not None, told
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(found.group(0))
    assert _capture(a).state == "succeeded"
    assert (_slot_since(dsn, slot) or 0) > since
    assert _lake(a) == _source(dsn)
    _turned_away(b, "another Combined project")


def test_a_project_that_streamed_before_the_marks_keeps_its_slot(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """A publication made before the marks, with a checkpoint in the lake: the project
    streams on, and its setup marks the publication its own."""
    a, b, dsn, slot = two
    assert _capture(a).state == "succeeded"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS NULL").format(sql.Identifier(slot)))
    since = _slot_since(dsn, slot)
    _turned_away(b, "carries no Combined project's mark")
    assert _slot_since(dsn, slot) == since
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM items WHERE id = 2")
    setup = tools.cli(a, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert project_id(LakeLayout(a / "lake")) in (_mark(dsn, slot) or "")
    assert _lake(a) == _source(dsn)
    _turned_away(b, "another Combined project")


def test_status_leaves_out_the_slots_another_project_marked(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """Another project's slot under the same prefix was told as this one's undeclared
    slot, with the statements that drop it."""
    a, b, dsn, slot = two
    assert _capture(a).state == "succeeded"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE other (id bigint PRIMARY KEY)")
    yaml = b / "combined.yaml"
    yaml.write_text(yaml.read_text().replace("public.items", "public.other"))
    status = tools.cli(b, "cdc", "status", "pg")
    assert status.returncode == 0 and slot not in status.stderr, status.stderr
    # No mark (made before the marks): it may be this project's, and is told.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS NULL").format(sql.Identifier(slot)))
    status = tools.cli(b, "cdc", "status", "pg")
    assert status.returncode == 0 and f"slot {slot} is named" in status.stderr, status.stderr


def test_check_and_status_write_nothing_to_a_lake_that_has_no_id_yet(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """`combined check` and `cdc status` only read: they made the project's id in the
    lake when it had none, so on a lake not yet provisioned, or one the account may only
    read, they failed ("the lake's project id could not be written")."""
    a, b, _, _ = two
    assert _capture(a).state == "succeeded"  # (a's publication marked a's)
    for argv in (("check",), ("cdc", "status", "pg")):
        done = tools.cli(b, *argv)
        assert not (b / "lake" / "_combined" / "project").exists(), argv
        if argv == ("check",):  # (a's marked publication is refused as another's, no id made)
            said = done.stdout + done.stderr
            assert done.returncode == 2 and "another Combined project" in said, said
        else:
            assert done.returncode == 0, done.stdout + done.stderr
    # (the first capture makes the id, and is refused: before its Run, as check is)
    _turned_away(b, "another Combined project")
    assert (b / "lake" / "_combined" / "project").exists()


def test_a_publication_marked_before_with_the_lake_is_still_ours_and_remarked_without_it(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """A mark that named the lake after the id (what Combined wrote before) still proves
    the publication the project's: its idle slot, an interrupted stand-up's leftover, is
    dropped and made again, and the mark rewritten with the id alone."""
    a, b, dsn, slot = two
    pg = Settings(dsn)
    ensure_publication(pg, slot, ["public.items"])
    create_slot(pg, slot).release_snapshot()
    since = _slot_since(dsn, slot)
    owner = project_id(LakeLayout(a / "lake"))
    older = f"combined project {owner}, lake {(a / 'lake').resolve()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                sql.Identifier(slot), sql.Literal(older)
            )
        )
    assert _capture(a).state == "succeeded"
    assert (_slot_since(dsn, slot) or 0) > (since or 0)  # the leftover, made again
    assert _mark(dsn, slot) == f"combined project {owner}"
    assert _lake(a) == _source(dsn)
    _turned_away(b, "another Combined project", owner)


def test_a_project_whose_lake_was_wiped_is_told_it_may_drop_its_own_slot(
    two: tuple[Path, Path, str, str], tools: Any
) -> None:
    """A new lake is a new project id: the publication the project made before reads as
    another project's. The refusal says that it may be the project's own, and how to drop
    it."""
    a, _, dsn, slot = two
    assert _capture(a).state == "succeeded"
    before = project_id(LakeLayout(a / "lake"))
    shutil.rmtree(a / "lake")
    shutil.rmtree(a / ".combined")
    wiped = "if this project made them before its lake was wiped or replaced"
    checked = tools.cli(a, "check")
    said = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 2 and before in said, said
    assert wiped in said.lower() and "this one has no id yet" in said, said
    told = _turned_away(a, "another Combined project", before)
    now = project_id(LakeLayout(a / "lake"))
    assert now != before and f"this one is project {now}" in told
    assert wiped in told.lower()
    drop = re.search(r"SELECT pg_drop_replication_slot\(.*?; DROP PUBLICATION \S+;", told)
    assert drop is not None, told
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in drop.group(0).split(";")[:2]:
            conn.execute(statement)
    assert _capture(a).state == "succeeded"
    assert _mark(dsn, slot) == f"combined project {now}"
    assert _lake(a) == _source(dsn)


@pytest.fixture
def dba(two: tuple[Path, Path, str, str]) -> Iterator[tuple[Path, Path, str, str]]:
    """``two``, capturing as a role that owns nothing, through a publication a DBA (a
    superuser) created: the role may not mark it (COMMENT takes the owner)."""
    a, b, dsn, slot = two
    role = f"ct_cap_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
        try:
            conn.execute(sql.SQL("GRANT SELECT ON items TO {}").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE items").format(sql.Identifier(slot))
            )
            for root in (a, b):
                yaml = root / "combined.yaml"
                yaml.write_text(yaml.read_text().replace(dsn, make_conninfo(dsn, user=role)))
            yield a, b, dsn, slot
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_an_interrupted_first_capture_through_a_dba_publication_is_made_again_alone(
    dba: tuple[Path, Path, str, str], tools: Any
) -> None:
    """The role cannot mark a DBA's publication, so the slot an interrupted first capture
    left was refused at every retry (the worker's requeue too) until a person dropped it.
    The project's lake now records the slot it made, and the retry knows it its own."""
    a, b, dsn, slot = dba
    since = _interrupted(a, dsn, slot, tools)
    assert _mark(dsn, slot) is None  # (the role could not mark it)
    # Another project has no record of it: refused, the slot left alone.
    _turned_away(b, "carries no Combined project's mark")
    assert _slot_since(dsn, slot) == since
    _made_again(a, dsn, slot, since)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM items WHERE id = 2")
    assert _capture(a).state == "succeeded"  # (and it streams on)
    assert _lake(a) == _source(dsn)


def test_a_slot_the_lake_does_not_record_is_refused_through_a_dba_publication(
    dba: tuple[Path, Path, str, str], tools: Any
) -> None:
    """A slot of the name a person made, or one made after the project's own was
    dropped: the lake's record names another slot (its consistent point), or none."""
    a, _, dsn, slot = dba
    pg = Settings(dsn)
    create_slot(pg, slot).release_snapshot()  # (a person's, before any capture)
    since = _slot_since(dsn, slot)
    _turned_away(a, "nothing proves", f"pg_drop_replication_slot('{slot}')")
    assert _slot_since(dsn, slot) == since
    drop_slot(pg, slot)
    _interrupted(a, dsn, slot, tools)
    # The project's leftover dropped, and a slot of the name made again by another.
    drop_slot(pg, slot, wait_seconds=10.0)
    create_slot(pg, slot).release_snapshot()
    since = _slot_since(dsn, slot)
    _turned_away(a, "nothing proves")
    assert _slot_since(dsn, slot) == since


def test_a_slot_whose_record_cannot_be_kept_is_dropped_again(
    dba: tuple[Path, Path, str, str],
) -> None:
    """Kept, it would be refused at the retry as a slot nothing proves the project's."""
    a, _, dsn, slot = dba
    (a / "lake" / "_combined").mkdir(parents=True)
    (a / "lake" / "_combined" / "streams").write_text("not a directory")
    _refused(_capture(a), "stream record")
    assert _slot_since(dsn, slot) is None
    (a / "lake" / "_combined" / "streams").unlink()
    assert _capture(a).state == "succeeded"
    assert _lake(a) == _source(dsn)


def _made_meanwhile(
    monkeypatch: pytest.MonkeyPatch, module: Any, dsn: str, slot: str
) -> list[int | None]:
    """Make ``module``'s next ``drop_slot`` of ``slot`` meet a slot of the name dropped
    and made again after it was judged (by a person, then another project); the new
    slot's restart position is put in the list returned."""
    made: list[int | None] = []
    drop = module.drop_slot

    def meanwhile(settings: Settings, name: str, **kwargs: Any) -> bool:
        if not made:  # between the judgement and the drop
            drop_slot(Settings(dsn), slot, wait_seconds=10.0)
            create_slot(Settings(dsn), slot).release_snapshot()
            made.append(_slot_since(dsn, slot))
        return bool(drop(settings, name, **kwargs))

    monkeypatch.setattr(module, "drop_slot", meanwhile)
    return made


def test_a_slot_made_again_after_it_was_judged_the_projects_leftover_is_left_alone(
    dba: tuple[Path, Path, str, str], tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging a slot the project's leftover (the lake's record) and dropping it were two
    statements, in two transactions: a slot of the name made again between them was
    dropped on the strength of the judgement of the one before. Only the slot judged is
    dropped now, in one statement; the next capture judges the new one afresh."""
    from combined.connectors.postgres import _stitch

    a, _, dsn, slot = dba
    _interrupted(a, dsn, slot, tools)
    made = _made_meanwhile(monkeypatch, _stitch, dsn, slot)
    _refused(_capture(a), f"replication slot '{slot}' changed since it was judged")
    assert made and made[0] is not None and _slot_since(dsn, slot) == made[0]
    monkeypatch.undo()
    _turned_away(a, "nothing proves")
    assert _slot_since(dsn, slot) == made[0]


def test_teardown_drops_only_the_slot_it_judged_the_projects(
    dba: tuple[Path, Path, str, str], tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cdc teardown`` judged, then dropped whatever slot of the name was there."""
    from combined import cdc
    from combined.connectors.postgres import _replication

    a, _, dsn, slot = dba
    _interrupted(a, dsn, slot, tools)
    made = _made_meanwhile(monkeypatch, _replication, dsn, slot)
    engine = Engine.open(a / "combined.yaml")
    try:
        with pytest.raises(SourceError, match="changed since it was judged"):
            cdc.teardown(engine, "pg")
    finally:
        engine.close()
    assert made and made[0] is not None and _slot_since(dsn, slot) == made[0]
