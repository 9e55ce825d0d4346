"""An inserts-only capture into an S3 lake uploads each Delivery's bytes once.

The table's data file is the Delivery as it is (linked, named after its
sha256); the raw layer's copy is then made by the store (CopyObject), not
uploaded again. Measured at a counting relay between Combined and the S3
server on 127.0.0.1: before, the capture sent every Delivery twice (once as
the table's data file, once into ``_deliveries/``).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `bench` lives at the repository root, next to `src`
    sys.path.insert(0, str(REPO))

from bench.proxy import counting  # noqa: E402

ROWS = 100_000


def _events(root: Path, bucket: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(root / "events.db")
    con.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, city TEXT, amount REAL)")
    con.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?)",
        ((i, f"name-{i:08d}-{i * 7919 % 100003}", f"city{i % 97}", i * 0.37) for i in range(ROWS)),
    )
    con.commit()
    con.close()
    project = root / "combined.yaml"
    project.write_text(
        f"version: 1\nlake: s3://{bucket}/lake\nsources:\n  app:\n    connector: sqlite\n"
        "    config:\n      path: ./events.db\n    datasets:\n      events:\n        key: [id]\n"
    )
    return project


def _objects(endpoint: str, bucket: str) -> dict[str, dict[str, Any]]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def _sha256(endpoint: str, bucket: str, key: str) -> str:
    import hashlib

    import boto3

    body = boto3.client("s3", endpoint_url=endpoint).get_object(Bucket=bucket, Key=key)["Body"]
    return hashlib.sha256(body.read()).hexdigest()


def test_an_inserts_only_capture_uploads_each_delivery_once(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _events(tmp_path, s3_bucket)
    with counting(s3_endpoint) as relay:
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
        engine = Engine.open(project)
        try:
            relay.reset()
            (run,) = engine.capture()
            sent = relay.sent
            assert run.state == "succeeded", run.error
            assert engine.sql("SELECT count(*) AS n FROM app.events").to_pylist() == [{"n": ROWS}]
            (delivery,) = engine.run(run.id)["deliveries"]
        finally:
            engine.close()
    objects = _objects(s3_endpoint, s3_bucket)
    raw = objects[f"lake/_deliveries/app/events/{Path(delivery.path).name}"]
    (table_file,) = [o for k, o in objects.items() if k.startswith("lake/app/events/part-")]
    # the raw layer's Delivery is the table's data file, byte for byte
    assert raw["Size"] == table_file["Size"] == delivery.byte_count
    assert _sha256(s3_endpoint, s3_bucket, raw["Key"]) == delivery.content_hash
    assert _sha256(s3_endpoint, s3_bucket, table_file["Key"]) == delivery.content_hash
    # What went over the wire: every object the capture left, except the raw
    # layer's copy, plus requests' headers and listings; not the Delivery again.
    others = sum(o["Size"] for k, o in objects.items() if o is not raw)
    print(
        f"\nuploaded {sent:,} bytes for {ROWS:,} rows: Delivery {delivery.byte_count:,}, "
        f"every object but the raw copy {others:,}, "
        f"the MAR table {sum(o['Size'] for k, o in objects.items() if '/_usage/' in k):,}"
    )
    assert others <= sent < others + delivery.byte_count // 4
    # named after its bytes: found by name
    assert table_file["Key"].endswith(f"part-{delivery.content_hash[:32]}-c000.zstd.parquet")
    staging = tmp_path / ".combined" / "staging"
    assert not any(p.is_file() for p in staging.rglob("*.parquet"))  # nothing left behind
