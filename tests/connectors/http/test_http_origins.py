"""Where the http connector's credentials may go: base_url's exact origin, and an allow-list."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from tests.connectors.http.fake_api import TOKEN, FakeAPI, order, serve
from tests.connectors.http.test_http_read import ENDPOINTS, _ids, _read, _source

from combined.errors import ConfigError, SourceError

ORIGIN: dict[str, Any] = {**ENDPOINTS, "origin": {"path": "/orders/origin", "paginate": "link"}}


def test_an_https_link_to_another_port_of_the_same_host_gets_no_credential(api: FakeAPI) -> None:
    """Reproduction: base_url is http://127.0.0.1:P and a page's ``Link: rel=next``
    points at https://127.0.0.1:Q. The old rule let an http to https "upgrade"
    on the same host through whatever the port, so the client connected to Q
    (another server) to send it the bearer token. Q here is a listener that
    records any connection: none may arrive, and the read fails naming Q."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        api.next_origin = f"https://127.0.0.1:{port}"
        with pytest.raises(SourceError, match="another host or port") as info:
            _read(_source(api, endpoints=ORIGIN, timeout=1), "origin")
        assert f"https://127.0.0.1:{port}" in info.value.message
        assert "credential_hosts" in (info.value.hint or "")
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing connected to the other port


def test_an_origin_listed_in_credential_hosts_receives_the_credential(api: FakeAPI) -> None:
    for other in serve():
        other.orders = {i: order(i) for i in range(1, 6)}
        api.next_origin = f"http://127.0.0.1:{other.port}"
        with pytest.raises(SourceError, match="another host or port"):
            _read(_source(api, endpoints=ORIGIN), "origin")
        assert other.requests == []
        allowed = _source(
            api, endpoints=ORIGIN, credential_hosts=[f"http://127.0.0.1:{other.port}/"]
        )
        table, _, _ = _read(allowed, "origin")
        assert _ids(table) == [1, 2, 3, 4, 5]
        assert other.seen("/v1/orders/link")[0].headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "value",
    [["ftp://127.0.0.1"], ["https://h/v1"], ["https://u:p@h"], ["https://h:99999"], "https://h"],
)
def test_credential_hosts_take_origins_only(api: FakeAPI, value: Any) -> None:
    with pytest.raises(ConfigError, match="credential_hosts"):
        _source(api, credential_hosts=value)
