"""DuckDB's reads of an object-store lake ask each Parquet file's size of the store once."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper

from combined.lake._store import LakeStore


def test_a_parquet_files_size_is_asked_once_for_every_query(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Delta data file never changes once written. DuckDB opened each file
    # of a table several times in every query, and each open asked the
    # store for its size: 738 HEAD requests in one small capture on S3.
    store = LakeStore.at(f"s3://{s3_bucket}/lake")
    files = [store.join(f"part-{n}.parquet") for n in range(3)]
    for n, location in enumerate(files):
        with store.fs.open_output_stream(store.path(location)) as out:
            pq.write_table(pa.table({"n": list(range(n * 10, n * 10 + 10))}), out)
    asked: list[str] = []
    real = ArrowFSWrapper.info

    def info(self: ArrowFSWrapper, path: Any, **kwargs: Any) -> Any:
        asked.append(str(path))
        return real(self, path, **kwargs)

    monkeypatch.setattr(ArrowFSWrapper, "info", info)
    for _ in range(3):
        con = duckdb.connect()
        query = f"SELECT sum(n) FROM {store.duck_source(con, files)}"
        (total,) = con.execute(query).fetchall()[0]
        con.close()
        assert total == sum(range(30))
    assert sorted(asked) == sorted(store.path(f) for f in files)
    assert store.size(files[0]) == store.sizes[store.path(files[0])] > 0


def test_the_size_of_a_file_the_store_lacks_is_file_not_found(lake_url: str) -> None:
    """Before, an object store's missing file raised TypeError (``int(None)``).

    A Delta log naming a data file the store lost then broke recovery with
    "int() argument must be ... not 'NoneType'" instead of its own error
    (the file neither staging nor the raw layer holds, and what to do).
    """
    store = LakeStore.at(lake_url)
    missing = store.join("s", "d", "part-gone.parquet")
    with pytest.raises(FileNotFoundError, match="part-gone.parquet"):
        store.size(missing)
