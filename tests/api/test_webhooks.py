"""Provider-verified webhooks: signed deliveries queue one capture of exactly one dataset."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from combined.api import create_app
from combined.api._webhooks import signature
from combined.config import parse_project
from combined.engine import Engine
from combined.errors import ConfigError

TOKEN = "t0ken-for-the-webhook-tests-0123"
SHOP_SECRET = "shop-hook-Secret-1"
ORDERS_SECRET = "orders-hook-Secret-2"

PROJECT = """\
version: 1
lake: ./lake
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
    webhook:
      secret: {secret: "env:SHOP_HOOK_SECRET"}
    datasets:
      customers:
        key: [id]
      orders:
        key: [id]
        webhook:
          secret: {secret: "env:ORDERS_HOOK_SECRET"}
          header: X-Shop-Hmac
          prefix: ""
  other:
    connector: sqlite
    config:
      path: ./other.db
    datasets:
      x:
        key: [id]
"""

BODY = b'{"event": "order.updated", "id": 42}'


@pytest.fixture
def hooked(tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shop with webhooks: the source's (customers) and the orders' own."""
    tools.make(tmp_path)
    with sqlite3.connect(tmp_path / "other.db") as con:
        con.execute("CREATE TABLE x (id INTEGER PRIMARY KEY)")
    (tmp_path / "combined.yaml").write_text(PROJECT)
    monkeypatch.setenv("SHOP_HOOK_SECRET", SHOP_SECRET)
    monkeypatch.setenv("ORDERS_HOOK_SECRET", ORDERS_SECRET)
    return tmp_path


@pytest.fixture
def client(hooked: Path) -> Iterator[TestClient]:
    """The API over the hooked shop, without the bearer token (webhooks need none)."""
    with TestClient(create_app(hooked / "combined.yaml", token=TOKEN)) as c:
        yield c


def _signed(secret: str, body: bytes = BODY) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _runs(hooked: Path) -> list[Any]:
    engine = Engine.open(hooked / "combined.yaml")
    try:
        return engine.runs(100)
    finally:
        engine.close()


def _activity(hooked: Path) -> int:
    engine = Engine.open(hooked / "combined.yaml")
    try:
        return len(engine.activity(1000))
    finally:
        engine.close()


def test_the_signature_is_the_hmac_sha256_of_the_raw_body() -> None:
    # The example of docs/api.md, so a provider integration can be checked by hand.
    assert signature("It's a Secret to Everybody", b"Hello, World!") == (
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_a_signed_delivery_queues_one_capture_of_exactly_that_dataset(
    hooked: Path, client: TestClient
) -> None:
    sent = client.post(
        "/webhooks/shop/customers",
        content=BODY,
        headers={"X-Signature-256": f"sha256={_signed(SHOP_SECRET)}"},
    )
    assert sent.status_code == 202, sent.text
    assert sent.json()["joined"] is False
    assert sent.json()["message"] == f"queued run {sent.json()['run_id']} to capture shop.customers"
    (run,) = _runs(hooked)
    assert (run.id, run.state, run.trigger) == (sent.json()["run_id"], "queued", "webhook")
    assert run.datasets == ("customers",)
    assert not (hooked / "lake" / "shop").exists()  # the request read nothing
    # the dataset's own setting: its header, no prefix, its secret
    own = client.post(
        "/webhooks/shop/orders", content=BODY, headers={"X-Shop-Hmac": _signed(ORDERS_SECRET)}
    )
    assert own.status_code == 202, own.text
    assert {r.datasets for r in _runs(hooked)} == {("customers",), ("orders",)}


def test_deliveries_while_a_capture_waits_join_it(
    hooked: Path, tools: Any, client: TestClient
) -> None:
    headers = {"X-Signature-256": f"sha256={_signed(SHOP_SECRET)}"}
    first = client.post("/webhooks/shop/customers", content=BODY, headers=headers).json()
    replayed = client.post("/webhooks/shop/customers", content=BODY, headers=headers)
    assert replayed.status_code == 202
    assert replayed.json()["joined"] is True
    assert replayed.json()["run_id"] == first["run_id"]
    assert "already queued" in replayed.json()["message"]
    assert len(_runs(hooked)) == 1

    worked = tools.cli(hooked, "worker", "--once", env={"SHOP_HOOK_SECRET": SHOP_SECRET})
    assert worked.returncode == 0, worked.stderr
    engine = Engine.open(hooked / "combined.yaml")
    try:
        done = engine.run(first["run_id"])
        assert done["run"].state == "succeeded", done["run"].error
        # a webhook capture changes a dataset exactly as a scheduled one does
        kinds = [e.kind for e in done["activity"]]
        assert "dataset.changed" in kinds and "publication" in kinds
    finally:
        engine.close()
    # once a worker took the Run, a new delivery queues a new capture
    later = client.post("/webhooks/shop/customers", content=BODY, headers=headers).json()
    assert later["joined"] is False and later["run_id"] != first["run_id"]


def _deliver_at_once(root: Path) -> None:
    """Deliveries for two datasets at the same moment: one Run each, the others join it.

    Both Runs are admitted under the same admission, and the first ones
    declare the source and its datasets: none of it may be stored twice.
    """
    engine = Engine.open(root / "combined.yaml")
    results: list[tuple[str, str, bool]] = []
    _ = engine.catalog  # created once, as the API does before serving
    try:

        def deliver(dataset: str) -> None:
            run, joined = engine.enqueue_dataset("shop", dataset)
            results.append((dataset, run.id, joined))

        threads = [threading.Thread(target=deliver, args=(d,)) for d in ["customers", "orders"] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        engine.close()
    assert len(results) == 8
    for dataset in ("customers", "orders"):
        mine = [(run_id, joined) for d, run_id, joined in results if d == dataset]
        assert len({run_id for run_id, _ in mine}) == 1
        assert sorted(joined for _, joined in mine) == [False, True, True, True]
    runs = _runs(root)
    assert sorted(r.datasets for r in runs) == [("customers",), ("orders",)]
    assert runs[0].admission_id == runs[1].admission_id


def test_concurrent_deliveries_queue_one_run(hooked: Path) -> None:
    _deliver_at_once(hooked)


@pytest.mark.postgres
def test_concurrent_deliveries_queue_one_run_on_a_postgresql_catalog(
    hooked: Path, pg_database: str
) -> None:
    project = hooked / "combined.yaml"
    project.write_text(
        project.read_text().replace("lake: ./lake\n", f"lake: ./lake\ncatalog: {pg_database}\n")
    )
    _deliver_at_once(hooked)
    assert not (hooked / ".combined" / "catalog.db").exists()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Signature-256": ""},
        {"X-Signature-256": "sha256=" + "0" * 64},
        {"X-Signature-256": _signed(SHOP_SECRET)},  # no prefix
        {"X-Signature-256": "sha256=" + _signed(ORDERS_SECRET)},  # another dataset's secret
        {"X-Signature-256": "sha256=" + _signed(SHOP_SECRET, BODY + b" ")},  # another body
        {"Authorization": f"Bearer {TOKEN}"},  # the API token is no signature
    ],
)
def test_an_unsigned_or_missigned_delivery_is_refused_and_records_nothing(
    hooked: Path, client: TestClient, headers: dict[str, str]
) -> None:
    before = _activity(hooked)
    refused = client.post("/webhooks/shop/customers", content=BODY, headers=headers)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["type"] == "InvalidSignature"
    assert "X-Signature-256" in refused.json()["error"]["message"]
    assert _runs(hooked) == []
    assert _activity(hooked) == before


def test_a_dataset_without_a_webhook_and_an_unknown_one_answer_alike(
    hooked: Path, client: TestClient
) -> None:
    answers = [
        client.post(path, content=BODY, headers={"X-Signature-256": "sha256=00"})
        for path in ("/webhooks/other/x", "/webhooks/shop/nope", "/webhooks/nope/x")
    ]
    for path, answer in zip(("other/x", "shop/nope", "nope/x"), answers, strict=True):
        assert answer.status_code == 404
        assert answer.json()["error"] == {
            "type": "NotFoundError",
            "message": f"no webhook at /webhooks/{path}",
            "hint": None,
        }
    assert _runs(hooked) == []


def test_an_unresolvable_secret_is_the_servers_fault_and_names_no_reference(
    hooked: Path, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHOP_HOOK_SECRET")
    answer = client.post(
        "/webhooks/shop/customers",
        content=BODY,
        headers={"X-Signature-256": f"sha256={_signed(SHOP_SECRET)}"},
    )
    assert answer.status_code == 503
    assert "SHOP_HOOK_SECRET" not in answer.text
    assert _runs(hooked) == []


def test_a_too_large_delivery_is_refused(hooked: Path, client: TestClient) -> None:
    body = b"x" * (1024 * 1024 + 1)
    answer = client.post(
        "/webhooks/shop/customers",
        content=body,
        headers={"X-Signature-256": f"sha256={_signed(SHOP_SECRET, body)}"},
    )
    assert answer.status_code == 413
    assert _runs(hooked) == []


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ('{secret: "abc"}', "holds a literal secret"),
        ("{secret: {secret: abc}}", "secret"),
        ('{secret: {secret: "env:X"}, header: "X Sig"}', "is not an HTTP header name"),
        ('{secret: {secret: "env:X"}, algorithm: md5}', "algorithm"),
        ("{header: X-Sig}", "secret"),
    ],
)
def test_a_webhook_setting_holds_a_secret_reference_only(setting: str, said: str) -> None:
    text = PROJECT.replace(
        '      secret: {secret: "env:SHOP_HOOK_SECRET"}\n', f"      {setting}\n", 1
    ).replace("    webhook:\n      ", "    webhook: ", 1)
    with pytest.raises(ConfigError, match=said):
        parse_project(yaml.safe_load(text))


def test_the_webhook_secret_is_not_part_of_the_admission(hooked: Path) -> None:
    # Changing the shared secret must not make queued Runs' admissions differ.
    engine = Engine.open(hooked / "combined.yaml")
    try:
        (run,) = engine.enqueue(["shop.customers"])
        admission = engine.run(run.id)["admission"]
        assert "HOOK_SECRET" not in str(admission.config)
        assert "webhook" not in admission.config["datasets"]["customers"]
    finally:
        engine.close()
