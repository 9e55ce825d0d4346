"""What an API's bodies hold, read exactly or refused clearly: encodings, text, keys."""

from __future__ import annotations

import pytest
from tests.connectors.http.fake_api import FakeAPI
from tests.connectors.http.test_http_read import _read, _source

from combined.errors import SchemaMismatch


def test_a_gzip_compressed_body_is_read(api: FakeAPI) -> None:
    """httpx asks for gzip; the body it decoded was decoded once more and failed."""
    source = _source(api, endpoints={"gz": {"path": "/gzip"}})
    table, _, _ = _read(source, "gz")
    assert table is not None and table.column("id").to_pylist() == [1, 2, 3, 4, 5]
    assert api.seen("/v1/gzip")[0].headers["accept-encoding"].startswith("gzip")


def test_a_body_its_content_encoding_does_not_decode_is_refused_with_a_hint(
    api: FakeAPI,
) -> None:
    """It failed with zlib's own words and no hint."""
    source = _source(api, endpoints={"bad": {"path": "/badgzip"}})
    with pytest.raises(SchemaMismatch, match="Content-Encoding does not decode") as info:
        _read(source, "bad")
    assert info.value.hint is not None and "Accept-Encoding: identity" in info.value.hint
