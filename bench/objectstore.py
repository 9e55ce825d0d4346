"""Case 10: the initial snapshot into an S3 lake on 127.0.0.1, next to the same into a local lake.

The S3 lake is a bucket on moto's standalone server (the test suite's S3
server), started on a free port of 127.0.0.1 for the run. Combined reaches it
through :class:`bench.proxy.CountingProxy`, which counts the bytes uploaded.
Both captures read the same table into fresh projects (``s3_local/``,
``s3_object/``), each in a case process of its own; each lake is then checked
against the source (row count and sum of ids).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import report
from bench.proxy import counting

if TYPE_CHECKING:
    from bench.report import CaseResult
    from bench.run import Context

LOCAL = "s3_local"
REMOTE = "s3_object"
TITLES = {
    LOCAL: "combined initial snapshot into a local lake (next to 10)",
    REMOTE: "combined initial snapshot into an S3 lake (moto on 127.0.0.1)",
}
#: The store's usual environment, as the test suite sets it (moto takes any key).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "combined-bench",
    "AWS_SECRET_ACCESS_KEY": "combined-bench-secret",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1, in a process of its own; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not start: {log.read_text()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _lake_totals(table: str, env: dict[str, str]) -> tuple[int, int] | None:
    """(rows, sum of ids) of the Delta table at ``table``, read in a process with ``env``."""
    # delta-rs's own query engine (DataFusion, in Rust), not to_pyarrow_table():
    # that reads through a Python filesystem (PyFileSystem(DeltaStorageHandler)),
    # and an Arrow thread that drops the last reference to one of its files
    # while the interpreter exits takes the GIL, is ended by Python inside a C++
    # destructor and aborts the process: "terminate called without an active
    # exception", exit 134, after the totals were printed (9 of 70 reads of an
    # S3 lake on moto; this query: 0 of 160).
    code = (
        "import json, sys\nimport pyarrow as pa\nfrom deltalake import DeltaTable, QueryBuilder\n"
        "q = QueryBuilder().register('t', DeltaTable(sys.argv[1]))\n"
        "r = pa.table(q.execute('SELECT count(*) AS n, coalesce(sum(id), 0) AS s FROM t'))\n"
        "print(json.dumps([r['n'][0].as_py(), r['s'][0].as_py()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, table], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:  # said, so that a failed read is not only "None"
        print(f"reading the lake at {table} failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    rows, ids = json.loads(done.stdout)
    return int(rows), int(ids)


def _source_totals(dsn: str, table: str) -> tuple[int, int]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*), coalesce(sum(id), 0) FROM {}").format(sql.Identifier(table))
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _check(res: CaseResult, ctx: Context, table: str, env: dict[str, str]) -> None:
    """Note whether the lake equals the source (rows and the sum of ids)."""
    lake, source = _lake_totals(table, env), _source_totals(ctx.dsn, ctx.table)
    res.extra["lake_equals_source"] = lake == source
    res.notes.append(
        f"lake = source ({source[0]:,} rows, sum of ids {source[1]:,})"
        if lake == source
        else f"lake {lake} != source {source} (rows, sum of ids)"
    )


def run_pair(ctx: Context) -> list[CaseResult]:
    """Case 10: the local lake's capture, then the S3 lake's (the bytes it uploads counted)."""
    from bench.run import combined_args, run_op, write_project

    results = []
    local_dir = ctx.workdir / LOCAL
    project = write_project(local_dir, ctx.dsn, ctx.table, ctx.args.reduction_memory)
    args = combined_args(ctx, project, "orders", ctx.table)
    res = run_op(ctx, LOCAL, "10 (local)", TITLES[LOCAL], "combined", args, local_dir / "lake")
    if res.ok:
        _check(res, ctx, str(local_dir / "lake" / "pg" / "orders"), ctx.env)
    results.append(res)
    remote_dir = ctx.workdir / REMOTE
    with s3_server(ctx.workdir / "logs" / "s3-server.log") as endpoint, counting(endpoint) as relay:
        import boto3

        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint, **_keys()).create_bucket(Bucket=bucket)
        env = {**ctx.env, **S3_ENV, "AWS_ENDPOINT_URL": relay.url}
        project = write_project(remote_dir, ctx.dsn, ctx.table, ctx.args.reduction_memory)
        lake = f"s3://{bucket}/lake"
        project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
        args = combined_args(ctx, project, "orders", ctx.table)
        saved, ctx.env = ctx.env, env
        try:
            # (no local lake: nothing is written under this directory)
            nothing = remote_dir / "no-local-lake"
            res = run_op(ctx, REMOTE, "10 (S3)", TITLES[REMOTE], "combined", args, nothing)
        finally:
            ctx.env = saved
        if res.ok:
            res.extra["uploaded_bytes"] = relay.sent
            res.notes.append(f"uploaded {report.fmt_bytes(relay.sent)} (counted at a relay)")
            res.notes += _objects(endpoint, bucket, res)
            _check(res, ctx, f"{lake}/pg/orders", env)
    results.append(res)
    return results


def _keys() -> dict[str, Any]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_REGION"],
    }


def _objects(endpoint: str, bucket: str, res: CaseResult) -> list[str]:
    """What the S3 lake holds after the capture, by area (table, raw, usage, ledger)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **_keys())
    areas: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            if o["Key"].endswith("/"):
                continue  # a directory marker
            top = o["Key"].split("/")[1]
            areas[top] = areas.get(top, 0) + int(o["Size"])
    res.extra["lake_areas"] = areas
    names = {"pg": "table", "_deliveries": "raw", "_usage": "usage", "_combined": "ledger"}
    held = ", ".join(f"{names.get(k, k)} {report.fmt_bytes(v)}" for k, v in sorted(areas.items()))
    return [f"the bucket holds: {held}"]


__all__ = ["LOCAL", "REMOTE", "run_pair", "s3_server"]
