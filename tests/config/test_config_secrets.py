"""Secret references: finding, resolving, redacting and hashing configurations."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from combined.config import (
    config_digest,
    find_secret_refs,
    is_secret_ref,
    redact_config,
    resolve_secret,
    resolve_secrets,
)
from combined.config._secrets import REFERENCE_HINT, config_problems
from combined.errors import ConfigError, SecretError

CONFIG: dict[str, Any] = {
    "path": "./shop.db",
    "password": {"secret": "env:SHOP_PASSWORD"},
    "replicas": [
        {"host": "a", "password": {"secret": "file:secrets/a.txt"}},
        {"host": "b"},
    ],
    "tls": {"key": {"secret": "file:/etc/tls/key.pem"}},
}


def test_find_secret_refs_gives_dotted_paths_in_order() -> None:
    assert find_secret_refs(CONFIG) == [
        ("password", "env:SHOP_PASSWORD"),
        ("replicas[0].password", "file:secrets/a.txt"),
        ("tls.key", "file:/etc/tls/key.pem"),
    ]


def test_find_secret_refs_ignores_mappings_that_are_not_references() -> None:
    assert find_secret_refs({"a": {"secret": "env:X", "b": 1}, "c": {"secret": 5}}) == []
    assert not is_secret_ref({"secret": "env:X", "b": 1})
    assert is_secret_ref({"secret": "env:X"})


def test_resolve_replaces_references_and_leaves_the_input_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_PASSWORD", "env-value")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "a.txt").write_text("file-value\n")
    config = {k: v for k, v in CONFIG.items() if k != "tls"}
    before = copy.deepcopy(config)
    resolved = resolve_secrets(config, tmp_path)
    assert resolved == {
        "path": "./shop.db",
        "password": "env-value",
        "replicas": [{"host": "a", "password": "file-value"}, {"host": "b"}],
    }
    assert config == before


def test_missing_env_secret_names_reference_and_path_but_no_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRST", "first-secret-value")
    monkeypatch.delenv("SHOP_PASSWORD", raising=False)
    config = {"user": {"secret": "env:FIRST"}, "password": {"secret": "env:SHOP_PASSWORD"}}
    with pytest.raises(SecretError) as info:
        resolve_secrets(config, tmp_path, prefix="sources.shop.config")
    text = info.value.describe()
    assert "env:SHOP_PASSWORD" in str(info.value)
    assert "sources.shop.config.password" in str(info.value)
    assert "SHOP_PASSWORD" in (info.value.hint or "")
    assert "first-secret-value" not in text + repr(info.value.context)
    assert isinstance(info.value, ConfigError)


def test_file_secret_is_relative_to_root_not_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pw.txt").write_text("from-root")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pw.txt").write_text("from-cwd")
    monkeypatch.chdir(elsewhere)
    assert resolve_secret("file:pw.txt", tmp_path) == "from-root"


@pytest.mark.parametrize(
    ("content", "value"),
    [("pw\n", "pw"), ("pw\r\n", "pw"), ("pw\n\n", "pw\n"), ("pw", "pw"), (" pw \n", " pw ")],
)
def test_file_secret_loses_exactly_one_trailing_newline(
    tmp_path: Path, content: str, value: str
) -> None:
    (tmp_path / "pw.txt").write_bytes(content.encode())
    assert resolve_secrets({"password": {"secret": "file:pw.txt"}}, tmp_path) == {"password": value}


def test_unreadable_file_secret_names_reference_and_path(tmp_path: Path) -> None:
    with pytest.raises(SecretError) as info:
        resolve_secrets({"db": {"password": {"secret": "file:secrets/none.txt"}}}, tmp_path)
    assert "file:secrets/none.txt" in str(info.value)
    assert "db.password" in str(info.value)
    assert str(tmp_path / "secrets" / "none.txt") in (info.value.hint or "")


@pytest.mark.parametrize("reference", ["hunter2", "vault:x", "env:", "env:not a name"])
def test_malformed_reference_is_refused_without_quoting_it(tmp_path: Path, reference: str) -> None:
    with pytest.raises(SecretError) as info:
        resolve_secret(reference, tmp_path, where="password")
    assert str(info.value).startswith("password ")
    assert reference not in str(info.value)


def test_redact_keeps_references_and_masks_literals() -> None:
    config = {
        "password": "hunter2",
        "Api-Key": 12345,
        "user_token": "tok",
        "dsn": "postgresql://me:hunter2@db/x",
        "conninfo": "host=db password=hunter2 user=me",
        "ref": {"secret": "env:PW"},
        "hosts": [{"passwd": "hunter2", "port": 5432}],
        "empty_password": "",
        "name": "shop",
    }
    before = copy.deepcopy(config)
    assert redact_config(config) == {
        "password": "***",
        "Api-Key": "***",
        "user_token": "***",
        "dsn": "postgresql://me:***@db/x",
        "conninfo": "host=db password=*** user=me",
        "ref": {"secret": "env:PW"},
        "hosts": [{"passwd": "***", "port": 5432}],
        "empty_password": "",
        "name": "shop",
    }
    assert config == before


def test_digest_is_stable_and_ignores_key_order() -> None:
    a = {"path": "./shop.db", "opts": {"x": 1, "y": [1, 2]}, "pw": {"secret": "env:A"}}
    b = {"pw": {"secret": "env:A"}, "opts": {"y": [1, 2], "x": 1}, "path": "./shop.db"}
    digest = config_digest(a)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert config_digest(b) == digest
    assert config_digest(copy.deepcopy(a)) == digest


@pytest.mark.parametrize(
    "change",
    [
        {"path": "./other.db"},
        {"pw": {"secret": "env:B"}},
        {"opts": {"x": 1, "y": [2, 1]}},
        {"extra": None},
    ],
)
def test_digest_changes_when_config_changes(change: dict[str, Any]) -> None:
    base = {"path": "./shop.db", "opts": {"x": 1, "y": [1, 2]}, "pw": {"secret": "env:A"}}
    assert config_digest({**base, **change}) != config_digest(base)


def test_digest_does_not_depend_on_a_literal_secret() -> None:
    assert config_digest({"password": "one"}) == config_digest({"password": "two"})


LITERAL = "SECRETPW"

CREDENTIAL_KEYS = [
    "password",
    "pasword",
    "pgpassword",
    "sslpassword",
    "PGPASSWORD",
    "db_password",
    "passwd",
    "pwd",
    "pass",
    "passphrase",
    "ssh_passphrase",
    "secret",
    "client_secret",
    "clientSecret",
    "token",
    "access_token",
    "authToken",
    "api_key",
    "apiKey",
    "APIKey",
    "apikey",
    "Api-Key",
    "x-api-key",
    "api_keys",
    "access_key",
    "secret_access_key",
    "aws_secret_access_key",
    "AWS_SECRET_ACCESS_KEY",
    "secret_key",
    "private_key",
    "private_key_pem",
    "password_value",
    "credentials",
    "Authorization",
    "bearer",
    "session_cookie",
    "Cookie",
    "jwt",
]

# Keys the connectors, the tests and the docs use, and look-alikes that name
# something other than a credential.
PLAIN_KEYS = [
    "key",
    "keys",
    "primary_key",
    "sort_key",
    "key_column",
    "cursor",
    "dsn",
    "path",
    "schemas",
    "slot_prefix",
    "connect_timeout",
    "application_name",
    "busy_timeout_ms",
    "batch_rows",
    "tables",
    "datasets",
    "script",
    "state_file",
    "check",
    "fields",
    "password_file",
    "passfile",
    "token_url",
    "api_key_header",
    "secret_name",
    "sslkey",
    "bypass",
    "passport",
    "max_tokens",
    "cookie_domain",
    "jwt_audience",
]


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_a_literal_under_any_credential_key_is_refused_and_masked(key: str) -> None:
    for value in (LITERAL, 12345):
        assert config_problems({key: value}) == [((key,), "holds a literal secret", REFERENCE_HINT)]
        assert redact_config({key: value}) == {key: "***"}
    assert config_problems({key: {"secret": "env:PW"}}) == []


def test_a_literal_header_secret_is_pointed_at_auth_not_at_a_reference() -> None:
    """The hint said to use {secret: "env:NAME"}, which a header then refuses too (shown in
    errors and discovery): two messages to reach `auth` (found by an API review)."""
    ((where, what, hint),) = config_problems({"headers": {"X-Api-Key": LITERAL}})
    assert (where, what) == (("headers", "X-Api-Key"), "holds a literal secret")
    assert "under `auth`" in hint and "in: header, name: X-Api-Key" in hint
    ((_, _, hint),) = config_problems({"endpoints": {"e": {"params": {"api_key": LITERAL}}}})
    assert "under `auth`" in hint


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_keys_that_name_no_credential_keep_their_values(key: str) -> None:
    config = {key: "value", "scripted": {"datasets": {"orders": {key: ["id"]}}}}
    assert config_problems(config) == []
    assert redact_config(config) == config


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"password": {"value": LITERAL}}, [("password", "value")]),
        ({"password": [LITERAL]}, [("password", 0)]),
        ({"hosts": [{"api_key": [{"v": LITERAL}]}]}, [("hosts", 0, "api_key", 0, "v")]),
        (
            {"auth": {"token": {"parts": [LITERAL, 7]}}},
            [("auth", "token", "parts", i) for i in (0, 1)],
        ),
        # a group of settings: only its credentials are secrets, not the user name
        ({"credentials": {"user": "bob", "password": LITERAL}}, [("credentials", "password")]),
        ({"credentials": [LITERAL]}, [("credentials", 0)]),
    ],
)
def test_literals_nested_under_a_credential_key_are_refused_and_masked(
    config: dict[str, Any], where: list[tuple[str | int, ...]]
) -> None:
    problems = config_problems(config)
    assert [loc for loc, _, _ in problems] == where
    assert all(what == "holds a literal secret" for _, what, _ in problems)
    assert LITERAL not in repr(redact_config(config))
    assert "bob" in repr(redact_config(config)) or "bob" not in repr(config)


@pytest.mark.parametrize(
    "text",
    [
        f"host=127.0.0.1 dbname=postgres sslpassword={LITERAL}",
        f"host=h password='{LITERAL}'",
        f"host=h user=u pgpassword={LITERAL}",
        f"postgresql://u@h/db?sslmode=require&sslpassword={LITERAL}",
        f"postgresql://u:{LITERAL}@h/db",
        f"https://api.example.com/v1?api_key={LITERAL}",
    ],
)
def test_a_string_with_an_inline_credential_is_refused_and_masked(text: str) -> None:
    ((loc, what, hint),) = config_problems({"dsn": text})
    assert loc == ("dsn",) and "inline credential" in what and '{secret: "env:NAME"}' in hint
    assert LITERAL not in redact_config({"dsn": text})["dsn"]


@pytest.mark.parametrize(
    "text",
    [
        "host=h dbname=d sslmode=require sslkey=/etc/client.key passfile=/etc/pgpass",
        "host=h password=''",
        "postgresql://u@h:5432/db?password=&sslmode=require",
        "postgresql://u:@h/db",
    ],
)
def test_a_string_without_a_credential_is_accepted(text: str) -> None:
    assert config_problems({"dsn": text}) == []


@pytest.mark.parametrize("scheme", ["env", "file"])
def test_an_empty_secret_is_refused_naming_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    monkeypatch.setenv("PGPW", "")
    (tmp_path / "pw.txt").write_text("\n")
    reference = "env:PGPW" if scheme == "env" else "file:pw.txt"
    with pytest.raises(SecretError) as info:
        resolve_secrets({"password": {"secret": reference}}, tmp_path, prefix="sources.pg.config")
    assert str(info.value) == f"secret {reference} at sources.pg.config.password is empty"
    assert info.value.hint and "remove the reference" in info.value.hint
