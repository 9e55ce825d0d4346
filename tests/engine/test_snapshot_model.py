"""Snapshot captures against a model: random source mutations, then capture, then compare.

After every capture the published projection equals the source, the version
chain is consistent (an unchanged capture re-admits the parent, a return to an
earlier state is a new version with the earlier content digest) and MAR counts
each identity that ever changed exactly once.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
    datasets:
      items:
        key: [id]
"""

Row = tuple[str | None, int | None]
State = dict[int, Row]

KEYS = st.integers(min_value=1, max_value=30)
# None and "" (and 0 and None) must stay different payloads
ROWS = st.tuples(
    st.sampled_from([None, "", "a", "b", "é"]),
    st.one_of(st.none(), st.integers(min_value=-2, max_value=2)),
)
MUTATION = st.one_of(
    st.tuples(st.just("put"), KEYS, ROWS),  # insert, update, or re-insert a deleted key
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("restore"), st.integers(min_value=0, max_value=8)),  # an earlier state
    st.tuples(st.just("clear")),  # the source table emptied
)
# Each round is a batch of mutations followed by one capture; an empty batch is an
# unchanged refresh.
ROUNDS = st.lists(st.lists(MUTATION, max_size=5), min_size=1, max_size=6)


def _write(db: Path, state: State) -> None:
    con = sqlite3.connect(db)
    con.execute("DELETE FROM items")
    con.executemany("INSERT INTO items VALUES (?, ?, ?)", [(k, *r) for k, r in state.items()])
    con.commit()
    con.close()


def _source(db: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    rows = con.execute("SELECT id, v, n FROM items ORDER BY id").fetchall()
    con.close()
    return rows


def _apply(state: State, mutation: tuple[Any, ...], captured: list[State]) -> State:
    out = dict(state)
    if mutation[0] == "put":
        out[mutation[1]] = mutation[2]
    elif mutation[0] == "delete":
        out.pop(mutation[1], None)
    elif mutation[0] == "clear":
        out = {}
    else:
        out = dict(captured[mutation[1] % len(captured)])
    return out


def _projection(engine: Engine) -> list[tuple[Any, ...]]:
    table = engine.sql("SELECT * FROM shop.items ORDER BY id")
    payload = [c for c in table.column_names if not c.startswith("_combined_")]
    assert payload == ["id", "v", "n"]
    return [tuple(r[c] for c in payload) for r in table.to_pylist()]


def _check_round(
    engine: Engine,
    db: Path,
    state: State,
    captured: list[State],
    digests: list[str | None],
    changed: dict[str, set[int]],
) -> None:
    before = engine.history("shop.items")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert _projection(engine) == _source(db) == sorted((k, *r) for k, r in state.items())
    ids = engine.sql(
        "SELECT count(*) - count(DISTINCT _combined_id) AS d FROM shop.items"
    ).to_pylist()
    assert ids == [{"d": 0}]

    after = engine.history("shop.items")
    # before the first capture the dataset is empty and has no version
    previous = captured[-1] if captured else {}
    (member,) = engine.publications(1)[0]["member_rows"]
    if state == previous:
        # an unchanged observation re-admits the parent: no new version
        assert [v["id"] for v in after] == [v["id"] for v in before]
        assert member["dataset_version"] == (after[-1]["id"] if after else None)
        assert not member["changed"]
    else:
        inserts = state.keys() - previous.keys()
        deletes = previous.keys() - state.keys()
        updates = {k for k in state.keys() & previous.keys() if state[k] != previous[k]}
        changed["insert"] |= inserts
        changed["update"] |= updates
        changed["delete"] |= deletes
        assert len(after) == len(before) + 1
        newest = after[-1]
        assert newest["id"] not in {v["id"] for v in before}
        assert newest["parent_id"] == (before[-1]["id"] if before else None)
        assert newest["row_count"] == len(state)
        assert (newest["inserts"], newest["updates"], newest["deletes"]) == (
            len(inserts),
            len(updates),
            len(deletes),
        )
        assert newest["run_id"] == run.id
        assert member["dataset_version"] == newest["id"] and member["changed"]
        # same content, same digest; different content, different digest
        for earlier, digest in zip(captured, digests, strict=True):
            if digest is not None:  # None: an empty first capture, which made no version
                assert (digest == newest["content_digest"]) == (earlier == state)
    # each version's parent is the version before it
    assert [v["parent_id"] for v in after] == [None, *(v["id"] for v in after)][: len(after)]
    captured.append(dict(state))
    digests.append(after[-1]["content_digest"] if after else None)

    usage = engine.usage()
    everything = changed["insert"] | changed["update"] | changed["delete"]
    if not usage:
        assert not everything
    elif len({u["month"] for u in usage}) == 1:  # every capture fell in the same month
        (u,) = usage
        assert u["mar"] == len(everything)
        assert (u["inserts"], u["updates"], u["deletes"]) == (
            len(changed["insert"]),
            len(changed["update"]),
            len(changed["delete"]),
        )


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(initial=st.dictionaries(KEYS, ROWS, max_size=30), rounds=ROUNDS)
def test_projection_and_version_chain_follow_the_source(
    initial: State, rounds: list[list[tuple[Any, ...]]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "shop.db"
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT, n INTEGER)")
        con.close()
        (root / "combined.yaml").write_text(PROJECT)
        engine = Engine.open(root / "combined.yaml")
        try:
            state = dict(initial)
            _write(db, state)
            captured: list[State] = []
            digests: list[str | None] = []
            changed: dict[str, set[int]] = {"insert": set(), "update": set(), "delete": set()}
            _check_round(engine, db, state, captured, digests, changed)
            for mutations in rounds:
                for m in mutations:
                    state = _apply(state, m, captured)
                _write(db, state)
                _check_round(engine, db, state, captured, digests, changed)
        finally:
            engine.close()


def _project(root: Path, rows: list[tuple[Any, ...]]) -> Engine:
    con = sqlite3.connect(root / "shop.db")
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT, n INTEGER)")
    con.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    (root / "combined.yaml").write_text(PROJECT)
    return Engine.open(root / "combined.yaml")


def test_a_source_table_emptied_after_a_capture_publishes_an_empty_projection(
    tmp_path: Path,
) -> None:
    engine = _project(tmp_path, [(1, "a", 1), (2, "b", 2)])
    try:
        engine.capture()
        con = sqlite3.connect(tmp_path / "shop.db")
        con.execute("DELETE FROM items")
        con.commit()
        con.close()
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM shop.items").to_pylist() == [{"n": 0}]
        assert engine.history("shop.items")[-1]["deletes"] == 2
    finally:
        engine.close()


def test_first_capture_of_an_empty_table_succeeds_and_queries_empty(tmp_path: Path) -> None:
    engine = _project(tmp_path, [])
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM shop.items").to_pylist() == [{"n": 0}]
    finally:
        engine.close()
