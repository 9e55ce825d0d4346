"""The adapter that adds GCS's XML uploads to fake-gcs-server (``tests/_gcs_xml.py``).

What delta-rs (``object_store``) sends a GCS bucket, checked request by
request: a conditional create that loses answers ``412`` and leaves the
winner's bytes; an XML multipart upload lands whole; a listing goes page by
page after ``start-after``. Without the adapter fake-gcs-server answers the
upload ``400 invalid uploadType`` and lists every key whatever ``start-after``.
"""

from __future__ import annotations

import http.client
import re
from urllib.parse import quote, urlencode, urlsplit

from tests.conftest import GCS_LIST_PAGE


def _request(
    url: str, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def _object(bucket: str, name: str, query: str = "") -> str:
    return f"/{bucket}/{quote(name, safe='')}" + (f"?{query}" if query else "")


def test_a_conditional_create_that_loses_answers_412(fake_gcs: str, gs_bucket: str) -> None:
    target, create = _object(gs_bucket, "_delta_log/0.json"), {"x-goog-if-generation-match": "0"}
    status, headers, _ = _request(fake_gcs, "PUT", target, b"first", create)
    assert status == 200, headers
    assert headers["etag"] and int(headers["x-goog-generation"]) > 0
    status, _, _ = _request(fake_gcs, "PUT", target, b"second", create)
    assert status == 412
    assert _request(fake_gcs, "GET", target)[2] == b"first"
    # a generation that matches replaces the object; a stale one does not
    current = {"x-goog-if-generation-match": headers["x-goog-generation"]}
    assert _request(fake_gcs, "PUT", target, b"third", current)[0] == 200
    assert _request(fake_gcs, "PUT", target, b"fourth", current)[0] == 412
    assert _request(fake_gcs, "GET", target)[2] == b"third"


def test_a_copy_honours_the_generation_precondition(fake_gcs: str, gs_bucket: str) -> None:
    source, target = _object(gs_bucket, "a"), _object(gs_bucket, "b")
    assert _request(fake_gcs, "PUT", source, b"bytes of a")[0] == 200
    copy = {"x-goog-copy-source": f"{gs_bucket}/a", "x-goog-if-generation-match": "0"}
    assert _request(fake_gcs, "PUT", target, b"", copy)[0] == 200
    assert _request(fake_gcs, "GET", target)[2] == b"bytes of a"
    assert _request(fake_gcs, "PUT", target, b"", copy)[0] == 412


def test_a_multipart_upload_lands_whole_on_completion(fake_gcs: str, gs_bucket: str) -> None:
    name = "t/part-0.parquet"
    status, _, body = _request(fake_gcs, "POST", _object(gs_bucket, name, "uploads"))
    assert status == 200, body
    (upload_id,) = re.findall(rb"<UploadId>(.*?)</UploadId>", body)
    parts = [b"a" * 1000, b"b" * 10, b"c"]
    etags = []
    for number, data in enumerate(parts, 1):
        query = urlencode({"partNumber": number, "uploadId": upload_id.decode()})
        status, headers, _ = _request(fake_gcs, "PUT", _object(gs_bucket, name, query), data)
        assert status == 200
        etags.append(headers["etag"])
    assert _request(fake_gcs, "HEAD", _object(gs_bucket, name))[0] == 404  # not yet
    done = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1)
    )
    query = urlencode({"uploadId": upload_id.decode()})
    status, headers, body = _request(
        fake_gcs,
        "POST",
        _object(gs_bucket, name, query),
        f"<CompleteMultipartUpload>{done}</CompleteMultipartUpload>".encode(),
    )
    assert status == 200, body
    assert b"<ETag>" in body and int(headers["x-goog-generation"]) > 0
    assert _request(fake_gcs, "GET", _object(gs_bucket, name))[2] == b"".join(parts)


def test_a_listing_starts_after_its_offset_and_goes_page_by_page(
    fake_gcs: str, gs_bucket: str
) -> None:
    names = [f"log/{n:05}.json" for n in range(2 * GCS_LIST_PAGE + 3)] + ["other"]
    for name in names:
        assert _request(fake_gcs, "PUT", _object(gs_bucket, name), b"{}")[0] == 200
    listed: list[str] = []
    query = {"list-type": "2", "prefix": "log/", "start-after": "log/00002.json"}
    while True:
        status, _, body = _request(fake_gcs, "GET", f"/{gs_bucket}?{urlencode(query)}")
        assert status == 200, body
        page = re.findall(r"<Key>(.*?)</Key>", body.decode())
        assert len(page) <= GCS_LIST_PAGE
        listed += page
        token = re.findall(r"<NextContinuationToken>(.*?)</", body.decode())
        if not token:
            assert b"<IsTruncated>false</IsTruncated>" in body
            break
        query["continuation-token"] = token[0]
    assert listed == names[3:-1]
    # max-keys, and the common prefixes of a listing by a delimiter
    query = {"list-type": "2", "delimiter": "/", "max-keys": "1"}
    first = _request(fake_gcs, "GET", f"/{gs_bucket}?{urlencode(query)}")[2].decode()
    assert "<CommonPrefixes><Prefix>log/</Prefix></CommonPrefixes>" in first
    assert "<Key>" not in first
    (token,) = re.findall(r"<NextContinuationToken>(.*?)</", first)
    query["continuation-token"] = token
    second = _request(fake_gcs, "GET", f"/{gs_bucket}?{urlencode(query)}")[2].decode()
    assert re.findall(r"<Key>(.*?)</Key>", second) == ["other"]


def test_delta_rs_writes_and_reads_a_large_file_in_parts(gs_bucket: str) -> None:
    """A data file past delta-rs' 5 MiB part size goes up by XML multipart upload."""
    import numpy as np
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from combined.lake import LakeStore

    url = f"gs://{gs_bucket}/lake/big"
    options = LakeStore.at(url).storage_options()
    values = np.random.default_rng(20).random(2_000_000)  # 16 MB that do not compress
    write_deltalake(url, pa.table({"x": values}), storage_options=options)
    table = DeltaTable(url, storage_options=options)
    (file,) = table.file_uris()
    assert LakeStore.at(url).fs.get_file_info(LakeStore.at(url).path(file)).size > 10 * 2**20
    assert np.array_equal(table.to_pyarrow_table().column("x").to_numpy(), values)
