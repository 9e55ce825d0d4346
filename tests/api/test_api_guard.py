"""A real server refuses foreign Hosts, cross-site writes and oversized bodies, and pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

NO_TOKEN = {"COMBINED_API_TOKEN": ""}


def test_without_a_token_only_a_loopback_host_is_answered(shop: Path, tools: Any) -> None:
    """DNS rebinding cannot reach a server run with --insecure-no-auth.

    Reproduction: `combined serve --insecure-no-auth` on 127.0.0.1; a web page
    at http://evil.example:PORT whose name is re-pointed at 127.0.0.1 sends
    `Host: evil.example:PORT`. The server read the runs and queued captures
    for it. Now any Host but a loopback name is answered 421.
    """
    with tools.serving(shop, "--insecure-no-auth", env=NO_TOKEN) as (base, _):
        port = base.rsplit(":", 1)[1]
        evil = {"Host": f"evil.example:{port}"}
        read = httpx.get(f"{base}/v1/runs", headers=evil)
        assert read.status_code == 421, read.text
        assert "only to a loopback host" in read.json()["error"]["message"]
        acted = httpx.post(f"{base}/v1/sources/shop/captures", headers=evil)
        assert acted.status_code == 421
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            assert httpx.get(f"{base}/v1/queue", headers={"Host": host}).status_code == 200, host
        assert httpx.get(f"{base}/v1/queue").json() == {"runs": []}  # nothing was queued


def test_a_cross_site_write_is_refused_and_a_same_origin_one_accepted(
    shop: Path, tools: Any
) -> None:
    """A page on another site cannot queue a capture on a loopback server without a token.

    Reproduction: a page at https://evil.example submits a form (or a no-cors
    fetch) to http://127.0.0.1:PORT/v1/sources/shop/captures; the browser
    sends `Origin: https://evil.example` and the server queued the capture.
    Now a state-changing request from another origin (or `Origin: null`, or
    `Sec-Fetch-Site: cross-site`) is answered 403; a script (no Origin) and
    the server's own origin still work.
    """
    with tools.serving(shop, "--insecure-no-auth", env=NO_TOKEN) as (base, _):
        url = f"{base}/v1/sources/shop/captures"
        for headers in (
            {"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Origin": "http://localhost:1"},  # another origin on this machine
            {"Sec-Fetch-Site": "cross-site"},
            {"Origin": base, "Sec-Fetch-Site": "same-site"},
        ):
            refused = httpx.post(url, headers=headers)
            assert refused.status_code == 403, (headers, refused.text)
            assert refused.json()["error"]["type"] == "CrossOriginRefused"
        assert httpx.get(f"{base}/v1/queue").json() == {"runs": []}
        # reads with a foreign Origin are answered (no CORS header lets a page read them)
        read = httpx.get(f"{base}/v1/runs", headers={"Origin": "https://evil.example"})
        assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
        own = httpx.post(url, headers={"Origin": base, "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 202, own.text
        assert httpx.post(url).status_code == 202  # a script sends no Origin
        # Both accepted; the second joins the capture the first queued.
        assert len(httpx.get(f"{base}/v1/queue").json()["runs"]) == 1


def test_an_oversized_body_is_refused_before_the_application(shop: Path, tools: Any) -> None:
    """A JSON body has a size limit, declared or streamed: 413 with a clear message.

    Reproduction: `POST /v1/quarantine/x/release` with a body of hundreds of
    megabytes was read whole into memory before validation. Now a body over
    64 KiB is refused with 413, whether `Content-Length` says so or the
    body streams (chunked) without one.
    """
    with tools.serving(shop, "--insecure-no-auth", env=NO_TOKEN) as (base, _):
        url = f"{base}/v1/quarantine/nope/release"
        big = b'{"reason": "' + b"x" * (200 * 1024) + b'", "by": "ana"}'
        declared = httpx.post(url, content=big, headers={"Content-Type": "application/json"})
        assert declared.status_code == 413, declared.text
        assert declared.json()["error"]["message"] == (
            "the request body is larger than 65536 bytes"
        )

        def chunks() -> Iterator[bytes]:
            for _ in range(100):
                yield b"x" * 4096

        streamed = httpx.post(url, content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413, streamed.text
        small = httpx.post(url, json={"reason": "r", "by": "ana"})
        assert small.status_code == 404  # read, validated, and the entry does not exist


def test_quarantine_records_come_in_capped_pages(shop: Path, tools: Any) -> None:
    """An entry's records are served a page at a time, never the whole entry.

    Reproduction: `GET /v1/quarantine/{entry}?limit=0` loaded every record of
    the entry into one answer (841 MB for 600k rows). Now `limit` is 1 to
    1000 (0 or more is refused with 422) and each page says the
    `next_offset` to ask for, None after the last; the pages hold every
    record exactly once.
    """
    pairs = ",".join(f"({i}, 'a{i}'), ({i}, 'b{i}')" for i in range(1, 1201))
    tools.sql(
        shop, f"CREATE TABLE people (id INTEGER, name TEXT); INSERT INTO people VALUES {pairs};"
    )
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + "      people:\n        key: [id]\n")
    assert tools.cli(shop, "capture", "shop.people").returncode == 3  # needs review
    with tools.serving(shop, "--insecure-no-auth", env=NO_TOKEN) as (base, _):
        (entry,) = httpx.get(f"{base}/v1/quarantine").json()["entries"]
        assert entry["record_count"] == 2400
        url = f"{base}/v1/quarantine/{entry['id']}"
        for limit in (0, 1001, 100_000):
            refused = httpx.get(url, params={"limit": limit})
            assert refused.status_code == 422, (limit, refused.text)
        first = httpx.get(url).json()
        assert (len(first["records"]), first["offset"], first["next_offset"]) == (20, 0, 20)
        names: list[str] = []
        offset: int | None = 0
        while offset is not None:
            page = httpx.get(url, params={"limit": 1000, "offset": offset}).json()
            assert len(page["records"]) <= 1000
            names += [r["name"] for r in page["records"]]
            offset = page["next_offset"]
        assert len(names) == 2400 and len(set(names)) == 2400
        assert httpx.get(url, params={"offset": 2400}).json()["records"] == []
        assert httpx.get(url, params={"offset": -1}).status_code == 422
