"""`timeout` bounds a whole HTTP request, against a real server dripping a byte at a time."""

from __future__ import annotations

import time

import pytest
from tests.connectors.http.drip import dripping
from tests.connectors.http.test_http_read import _read

from combined.connectors.http import HTTPSource
from combined.errors import SourceUnavailable


@pytest.mark.parametrize("drip_from", ["body", "head"])
def test_a_dripping_server_is_stopped_at_the_request_timeout(drip_from: str) -> None:
    """Reproduction: a server answering one byte every quarter second never
    lets a socket read wait as long as ``timeout``, so a 40-byte body (or a
    head padded to 40 bytes) took ~20 s against ``timeout: 1``: httpx's
    timeout bounds each read, not the request. The read must fail as
    transient about one second in, naming the bound."""
    with dripping(drip_from, body_bytes=40, interval=0.25) as drip:
        source = HTTPSource(
            {
                "base_url": drip.base_url,
                "timeout": 1,
                "endpoints": {"slow": {"path": "/slow", "allow_empty": True}},
            }
        )
        started = time.monotonic()
        with pytest.raises(SourceUnavailable) as info:
            _read(source, "slow")
        elapsed = time.monotonic() - started
    assert elapsed < 3, f"the request ran {elapsed:.1f} s past its 1 s timeout"
    assert "within 1 s" in info.value.message and "whole request" in info.value.message
    assert info.value.transient and drip.requests == 1


def test_a_fast_answer_is_untouched_by_the_deadline() -> None:
    with dripping("body", body_bytes=4, interval=0.01) as drip:
        source = HTTPSource(
            {
                "base_url": drip.base_url,
                "timeout": 2,
                "endpoints": {"slow": {"path": "/slow", "allow_empty": True}},
            }
        )
        table, _, receipt = _read(source, "slow")
        assert table is None and receipt.completed
