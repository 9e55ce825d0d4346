"""The probe a capture and `combined check` start with says an unreachable store in seconds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from combined.errors import LakeNotWritable
from combined.lake._probe import check_store
from combined.lake._store import PROBE_ATTEMPTS, LakeStore

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class _Busy(BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request 503 SlowDown, counting them."""

    seen: list[str]

    def _slow(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(SLOW_DOWN)))
        self.end_headers()
        self.wfile.write(SLOW_DOWN)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _slow

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    handler = type("Handler", (_Busy,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
        "AWS_ACCESS_KEY_ID": "probe-test",
        "AWS_SECRET_ACCESS_KEY": "probe-test-secret",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_tries_a_busy_store_a_few_times_not_a_data_files_eleven(
    busy: list[str],
) -> None:
    # A store that cannot take the probe (unreachable, or refusing every request
    # as busy) took the data files' eleven tries a request: 84 s against a closed
    # port before `combined check` or a capture said it could not be reached.
    with pytest.raises(LakeNotWritable) as told:
        check_store(LakeStore("s3://probe-bucket/lake"))
    assert "cannot be written" in told.value.message
    assert 1 <= len(busy) <= PROBE_ATTEMPTS, busy
