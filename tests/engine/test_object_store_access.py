"""A lake the store rejects is a clear error before any Run, and nothing is written.

Against an S3 server on 127.0.0.1 that checks every request's credentials
and permissions (moto's server, authorization on). Before object-store lakes
were supported, every case failed with "object-store lakes ... are not
supported by this build yet", naming neither the bucket, the credentials
nor the permission that was missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import runs as runs_repo
from combined.engine import Engine

#: How the lake's store is reached, less the credentials each case sets (or not).
S3_BASE = {"AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}
#: Requests the server answers before it checks credentials: the set-up's three.
SETUP_REQUESTS = 3


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An authorizing S3 server with a bucket and a user without any policy."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_REQUESTS)}
    log = tmp_path_factory.mktemp("strict-s3") / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        kw: dict[str, Any] = {
            "endpoint_url": endpoint,
            "aws_access_key_id": "AKIASETUP",
            "aws_secret_access_key": "setup",
            "region_name": "us-east-1",
        }
        boto3.client("s3", **kw).create_bucket(Bucket="granted-bucket")
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="no-policy")
        key = iam.create_access_key(UserName="no-policy")["AccessKey"]
        yield {
            "endpoint": endpoint,
            "key_id": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


CASES = {
    # (on a server that lets everyone in: an authorizing one answers 403 to a
    # principal without permission, whether the bucket exists or not)
    "no such bucket": ("missing-bucket", "open", "its bucket or container does not exist"),
    "unknown key": ("granted-bucket", "unknown", "the store refused the credentials"),
    "no credentials": ("granted-bucket", "none", "no credentials were found"),
    "no permission": ("granted-bucket", "valid", "lack permission to write (PutObject)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_rejected_lake_exits_2_before_any_run_and_writes_nothing(
    tmp_path: Path, tools: Any, strict_s3: dict[str, str], case: str, request: Any
) -> None:
    bucket, keys, expected = CASES[case]
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    lake = f"s3://{bucket}/lake"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    env = {**S3_BASE, "AWS_ENDPOINT_URL": strict_s3["endpoint"]}
    secret = "wrong-secret-value-1234"
    if keys == "open":
        env |= {
            "AWS_ENDPOINT_URL": request.getfixturevalue("s3_endpoint"),
            "AWS_ACCESS_KEY_ID": "AKIAOPEN",
            "AWS_SECRET_ACCESS_KEY": secret,
        }
    elif keys == "valid":
        env |= {
            "AWS_ACCESS_KEY_ID": strict_s3["key_id"],
            "AWS_SECRET_ACCESS_KEY": strict_s3["secret"],
        }
        secret = strict_s3["secret"]
    elif keys == "unknown":
        env |= {"AWS_ACCESS_KEY_ID": "AKIAUNKNOWN", "AWS_SECRET_ACCESS_KEY": secret}
    elif keys == "none":
        # moto answers an unsigned request with a 500 (its KeyError), which the
        # store's eleven tries waited out for ~80 s; S3 itself answers 403 at once.
        env |= {"AWS_MAX_ATTEMPTS": "2"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert lake in done.stderr and expected in done.stderr, done.stderr
    assert secret not in done.stderr + done.stdout
    assert not (tmp_path / ".combined" / "staging").exists()
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            assert runs_repo.list_runs(conn, limit=10) == []
    finally:
        engine.close()


def test_a_store_that_fails_a_read_is_a_lake_error_not_an_internal_one(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`combined sql` and `combined replay` on a lake whose store did not answer exited 70,
    "internal error (OSError) ... this is a bug in Combined"."""
    from combined.errors import LakeError
    from combined.lake import _query

    project = tools.make(tmp_path)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error

        def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise OSError(
                "Generic S3 error: Error after 10 retries in 104s, max_retries:10: error "
                "sending request for url (http://127.0.0.1:18999/lake/shop/orders/_delta_log)"
            )

        monkeypatch.setattr(_query, "run_query", unreachable)
        with pytest.raises(LakeError, match="could not be read: .*error sending request") as info:
            engine.sql("SELECT count(*) FROM shop.orders")
        assert "nothing was changed" in (info.value.hint or "")
        monkeypatch.setattr("combined.evidence.replay", unreachable)
        with pytest.raises(LakeError, match="replaying shop.orders: the lake at"):
            engine.replay("shop.orders")
    finally:
        engine.close()


def test_check_tells_a_lake_whose_bucket_is_missing_not_an_internal_error(
    tmp_path: Path, cdc_db: Any, s3_bucket: str, tools: Any
) -> None:
    """`combined check` of a project with a `cdc` dataset on a lake whose bucket did not
    exist exited 70, "internal error (OSError) ... this is a bug in Combined" (it reads each
    stream's committed checkpoint from the lake); and one without a `cdc` dataset said `ok`,
    the bucket told only by the first capture."""
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
    project = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id"])
    lake = f"s3://{s3_bucket}-missing/lake"
    (tmp_path / "combined.yaml").write_text(project.replace("lake: ./lake", f"lake: {lake}"))
    done = tools.cli(tmp_path, "check")
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert f"fail lake: the lake at {lake} cannot be written: its bucket or container" in out
    assert "hint: create it, or correct the bucket in `lake:`" in out
    assert f"fail pg: pg.items: the lake at {lake} could not be read: its bucket" in out
    assert "internal error" not in done.stdout + done.stderr
    # the bucket created: the lake and the source are told ok
    (tmp_path / "combined.yaml").write_text(
        project.replace("lake: ./lake", f"lake: s3://{s3_bucket}/lake")
    )
    done = tools.cli(tmp_path, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok   lake s3://{s3_bucket}/lake" in done.stdout
    assert "ok   pg" in done.stdout
