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


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("text", "field 's' holds text of 2 characters on page 1, which is not text of Unicode"),
        ("object", "field 'o' holds an object of 1 fields on page 1, which is not text of Unicode"),
        ("key", "a record holds a key that is not Unicode text ('\\ud800'"),
    ],
)
def test_a_lone_surrogate_escape_is_refused_naming_the_field(
    api: FakeAPI, where: str, message: str
) -> None:
    """JSON decodes "\\ud800" to a text UTF-8 cannot hold: the Run failed with Python's
    own encoding error, no field, no page, no hint."""
    source = _source(api, endpoints={"s": {"path": f"/surrogate/{where}"}})
    with pytest.raises(SchemaMismatch) as info:
        _read(source, "s")
    assert message in info.value.message
    assert info.value.hint is not None and info.value.hint.startswith("fix the")


@pytest.mark.parametrize("shape", ["exponent", "digits"])
def test_a_number_past_every_decimal_names_json_as_the_type_to_declare(
    api: FakeAPI, shape: str
) -> None:
    """The hint named decimal(N) or decimal(0), which refuse 1e400 and 40 digits too."""
    source = _source(api, endpoints={"p": {"path": f"/past/{shape}"}})
    with pytest.raises(SchemaMismatch) as info:
        _read(source, "p")
    assert "fields: {f: json}" in (info.value.hint or "")
    declared = _source(api, endpoints={"p": {"path": f"/past/{shape}", "fields": {"f": "json"}}})
    table, _, _ = _read(declared, "p")
    assert table is not None and table.column("f").to_pylist() == [
        "1" + "0" * (400 if shape == "exponent" else 39)
    ]
