"""HTTPS: the server is verified as httpx verifies it, with one TLS context a process."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tests.connectors.http.test_http_read import _read

from combined.connectors.http import HTTPSource, _deadline
from combined.errors import CombinedError


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no authority signed, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _Items(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = b'[{"id": 1}, {"id": 2}]'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate: (base URL, certificate)."""
    cert, key = _self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Items)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


def _source(base_url: str) -> HTTPSource:
    return HTTPSource({"base_url": base_url, "endpoints": {"items": {"path": "/items"}}})


def test_an_unknown_certificate_is_refused_and_a_trusted_one_read_with_one_context_each(
    https: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx made a TLS context for every read of an endpoint (~30 ms of CPU)."""
    base_url, cert = https
    made: list[int] = []
    create = httpx.create_ssl_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(1)
        return create(*args, **kwargs)

    monkeypatch.setattr(_deadline, "_CONTEXTS", {})
    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    for _ in range(2):
        with pytest.raises(CombinedError) as info:
            _read(_source(base_url), "items")
        assert "certificate" in info.value.describe().lower()
    assert len(made) == 1
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # (the server's certificate trusted)
    for _ in range(2):
        table, _, receipt = _read(_source(base_url), "items")
        assert table is not None and table.column("id").to_pylist() == [1, 2]
    assert len(made) == 2
