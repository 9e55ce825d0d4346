"""Two processes committing to the same table of an object-store lake at once.

On S3 (moto's server), GCS (fake-gcs-server behind ``tests/_gcs_xml.py``)
and Azure (Azurite), all on 127.0.0.1. Delta's commit protocol writes log
entry N only if no other writer has: on an object store that is the store's
conditional put (S3's ``If-None-Match: *``, which delta-rs uses with the
lake's storage options; GCS's ``x-goog-if-generation-match: 0``; Azure's
``If-None-Match: *``). Without it, two writers that both read version N-1
both write entry N, the later one replacing the earlier, and a commit (its
rows) vanishes from the table although its writer was told it landed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from combined.lake import LakeTable

#: The stores, each with its own conditional put.
ON_OBJECT_STORES = pytest.mark.parametrize("lake_url", ["s3", "gs", "az"], indirect=True)

SCHEMA = pa.schema([("writer", pa.string()), ("n", pa.int64())])

APPENDS = 8

#: argv: table URL, writer name, go file. Appends APPENDS one-row commits.
APPENDER = f"""
import os, sys, time
import pyarrow as pa
from combined.lake import LakeTable
url, name, go = sys.argv[1:4]
schema = pa.schema([("writer", pa.string()), ("n", pa.int64())])
table = LakeTable(url, "")
while not os.path.exists(go):
    time.sleep(0.01)
for n in range({APPENDS}):
    batch = pa.record_batch([pa.array([name]), pa.array([n], pa.int64())], schema=schema)
    table.append_batches(schema, iter([batch]), create=False, metadata={{"writer": name}})
"""

#: argv: table URL, writer name, go file. Commits delivery sequence 1 under the protocol.
COMMITTER = """
import os, sys, time
import pyarrow as pa
from combined.lake import LakeTable
url, name, go = sys.argv[1:4]
schema = pa.schema([("writer", pa.string()), ("n", pa.int64())])
table = LakeTable(url, "combined:s/d")
rows = pa.record_batch([pa.array([name]), pa.array([1], pa.int64())], schema=schema)
while not os.path.exists(go):
    time.sleep(0.01)
result = table.commit(
    first_sequence=1,
    last_sequence=1,
    mode="append",
    data=lambda: pa.RecordBatchReader.from_batches(schema, [rows]),
    metadata={"run_id": name, "first_sequence": 1, "last_sequence": 1,
              "ingested_at": "2026-01-01T00:00:00+00:00"},
    needs_merge=False,
)
print(result.skipped, result.run_id, result.lake_version)
"""


def _race(tmp_path: Path, code: str, url: str) -> list[str]:
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, url, name, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    time.sleep(1.0)  # both imported and waiting
    go.touch()
    outs = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        outs.append(out.strip())
    return outs


def _through_atomic_relay(request: pytest.FixtureRequest, lake_url: str) -> None:
    """An ``s3://`` lake reached through the relay that makes moto's conditional create atomic.

    moto checks ``If-None-Match: *`` and then writes, in two steps: three
    writers appending 40 times each through it directly lost a commit
    (version 119 of 120 expected). ``tests/_s3_faults.py`` serialises them.
    """
    if lake_url.startswith("s3://"):
        request.getfixturevalue("s3_faults")


def _created(url: str) -> LakeTable:
    table = LakeTable(url, "")
    table.append_batches(SCHEMA, iter([]), create=True, metadata={"writer": "setup"})
    return table


@ON_OBJECT_STORES
def test_two_processes_appending_at_once_lose_no_commit(
    tmp_path: Path, lake_url: str, request: pytest.FixtureRequest
) -> None:
    _through_atomic_relay(request, lake_url)
    url = f"{lake_url}/s/d"
    table = _created(url)
    _race(tmp_path, APPENDER, url)
    assert table.version() == 2 * APPENDS  # version 0 created the table
    rows = pa.Table.from_batches(
        [b for f in table.files() for b in _read(table, f)], schema=SCHEMA
    ).to_pylist()
    assert sorted((r["writer"], r["n"]) for r in rows) == [
        (w, n) for w in ("a", "b") for n in range(APPENDS)
    ]
    writers = [m["writer"] for m in table.commits()]
    assert sorted(writers) == ["a"] * APPENDS + ["b"] * APPENDS + ["setup"]


@ON_OBJECT_STORES
def test_two_processes_committing_the_same_sequence_commit_it_once(
    tmp_path: Path, lake_url: str, request: pytest.FixtureRequest
) -> None:
    _through_atomic_relay(request, lake_url)
    url = f"{lake_url}/s/d"
    table = _created(url)
    outs = _race(tmp_path, COMMITTER, url)
    results = sorted(out.split() for out in outs)  # "False a 1" / "True a 1"
    (fresh,) = [r for r in results if r[0] == "False"]
    (skipped,) = [r for r in results if r[0] == "True"]
    assert skipped[1:] == fresh[1:]  # the loser names the winner's run and version
    assert table.version() == 1
    assert LakeTable(url, "combined:s/d").committed_sequence() == 1
    assert [m["run_id"] for m in table.commits() if "run_id" in m] == [fresh[1]]


def _read(table: LakeTable, file: str) -> list[pa.RecordBatch]:
    import pyarrow.parquet as pq

    batches: list[pa.RecordBatch] = pq.ParquetFile(table.store.open_input(file)).read().to_batches()
    return batches


def _commit_first_sequence(table: LakeTable, run_id: str) -> bool:
    """Commit delivery sequence 1 as ``run_id``; whether it was skipped (already there)."""
    rows = pa.record_batch([pa.array([run_id]), pa.array([1], pa.int64())], schema=SCHEMA)
    result = table.commit(
        first_sequence=1,
        last_sequence=1,
        mode="append",
        data=lambda: pa.RecordBatchReader.from_batches(SCHEMA, [rows]),
        metadata={
            "run_id": run_id,
            "first_sequence": 1,
            "last_sequence": 1,
            "ingested_at": "2026-01-01T00:00:00+00:00",
        },
        needs_merge=False,
    )
    return result.skipped


def test_a_commit_landing_between_the_sequence_check_and_the_write_is_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits the same sequence while this one opens the table to write.

    The check of the committed sequence and the write now read one snapshot:
    the write conflicts with the other commit and the sequence is skipped.
    Before, the check read the table, then the write opened it again (seeing
    the other commit as its base, so no conflict) and sequence 1 was
    committed twice: the lake changed twice.
    """
    url = str(tmp_path / "lake" / "s" / "d")
    _created(url)
    racer = LakeTable(url, "combined:s/d")
    opened = racer._fresh
    calls = 0

    def open_as_another_writer_commits(version: int | None = None) -> object:
        nonlocal calls
        calls += 1
        snapshot = opened(version)
        if calls == 1:  # this writer read the table; the other commits before it writes
            assert _commit_first_sequence(LakeTable(url, "combined:s/d"), "other") is False
        return snapshot

    monkeypatch.setattr(racer, "_fresh", open_as_another_writer_commits)
    assert _commit_first_sequence(racer, "racer") is True
    table = LakeTable(url, "combined:s/d")
    assert table.version() == 1
    assert [m["run_id"] for m in table.commits() if "run_id" in m] == ["other"]
