"""The fake API every http connector test reads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.connectors.http.fake_api import FakeAPI, serve_orders


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    """A fake API on 127.0.0.1 serving orders 1 to 5."""
    yield from serve_orders()
