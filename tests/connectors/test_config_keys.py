"""Every connector refuses configuration keys it does not take, naming the closest."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from combined.connectors import check_config, connector_class, known_connectors
from combined.connectors.abc import Source
from combined.connectors.airbyte import AirbyteSource
from combined.connectors.singer import SingerSource
from combined.errors import ConfigError
from combined.testing import InMemorySource

SECRET = "SECRETPW"

# connector class, a configuration it takes, a misspelt key, the key meant
CASES: dict[str, tuple[type[Source], dict[str, Any], str, str]] = {
    "sqlite": (connector_class("sqlite"), {"path": "shop.db"}, "busy_timeout", "busy_timeout_ms"),
    "postgres": (connector_class("postgres"), {"dsn": "host=h dbname=d"}, "pasword", "password"),
    "mariadb": (connector_class("mariadb"), {"dsn": "mysql://u@h/d"}, "pasword", "password"),
    "mysql": (connector_class("mysql"), {"dsn": "mysql://u@h/d"}, "read_timout", "read_timeout"),
    "scripted": (connector_class("scripted"), {"script": []}, "state_fiel", "state_file"),
    "singer": (SingerSource, {"command": "tap-x"}, "idle_timout", "idle_timeout"),
    "airbyte": (AirbyteSource, {"command": "source-x"}, "max_line_byte", "max_line_bytes"),
    "memory": (InMemorySource, {"tables": {}}, "key", "keys"),
    "files": (connector_class("files"), {"path": "exports"}, "delimeter", "delimiter"),
    "http": (connector_class("http"), {"base_url": "https://api.x"}, "time_out", "timeout"),
}


def test_every_registered_connector_declares_the_keys_it_takes() -> None:
    assert set(known_connectors()) <= set(CASES)
    for cls, config, _, _ in CASES.values():
        assert cls.CONFIG_KEYS and set(config) <= set(cls.CONFIG_KEYS)
        cls(config).close()  # a configuration of known keys is taken


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_misspelt_key_is_refused_with_the_closest_and_every_accepted_key(name: str) -> None:
    cls, config, typo, meant = CASES[name]
    assert cls.CONFIG_KEYS is not None
    with pytest.raises(ConfigError) as info:
        cls({**config, typo: SECRET})
    error = info.value
    assert error.message == f"{typo!r} is not a known key of the {name} connector"
    assert error.hint is not None and error.hint.startswith(f"did you mean {meant!r}?")
    assert all(key in error.hint for key in cls.CONFIG_KEYS)
    assert SECRET not in error.describe() + repr(error.context) + repr(pickle.dumps(error))


def test_the_engine_check_names_the_dotted_path_and_every_unknown_key() -> None:
    cls = connector_class("postgres")
    config = {"dsn": "host=h", "pasword": {"secret": "env:PW"}, "colour": "red"}
    with pytest.raises(ConfigError) as info:
        check_config(cls, config, where="sources.pg.config")
    assert info.value.message == (
        "sources.pg.config.pasword, sources.pg.config.colour are not known keys "
        "of the postgres connector"
    )
    assert (info.value.hint or "").startswith("did you mean 'password' for 'pasword'? ")
    check_config(cls, {"dsn": "host=h", "password": {"secret": "env:PW"}}, where="x")


@pytest.mark.parametrize("cls", [SingerSource, AirbyteSource])
@pytest.mark.parametrize(
    ("command", "at"),
    [
        (["tap-x", "--token", {"secret": "env:TAP_TOKEN"}], "command[2]"),
        ({"secret": "env:TAP_COMMAND"}, "command"),
    ],
)
def test_a_secret_reference_in_a_programs_command_is_refused(
    cls: type[Source], command: Any, at: str
) -> None:
    # The command line of a process is readable by every user of the machine (ps).
    with pytest.raises(ConfigError) as info:
        check_config(cls, {"command": command}, where="sources.gh.config")
    error = info.value
    assert error.message.startswith(f"sources.gh.config.{at} holds a secret reference: ")
    assert "command line" in error.message and "(ps)" in error.message
    assert "`config:`" in (error.hint or "") and "`env:`" in (error.hint or "")
    # where a secret belongs, a reference is taken
    ref = {"secret": "env:TAP_TOKEN"}
    check_config(cls, {"command": "tap-x", "config": {"token": ref}, "env": {"T": ref}})


def test_a_connector_class_is_found_in_the_installed_metadata_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each lookup scanned every installed distribution (20-50 ms); a capture looked twice.
    from importlib.metadata import entry_points as scan

    from combined.connectors import _registry

    scans: list[str] = []

    def counted(*, group: str) -> Any:
        scans.append(group)
        return scan(group=group)

    monkeypatch.setattr(_registry, "entry_points", counted)
    monkeypatch.setattr(_registry, "_found", {}, raising=False)
    first = connector_class("sqlite")
    assert connector_class("sqlite") is first and len(scans) == 1
    with pytest.raises(ConfigError, match="unknown connector 'nope'"):
        connector_class("nope")  # a name not found is looked up again, every time


def test_a_misspelt_connector_is_told_with_the_closest_one() -> None:
    with pytest.raises(ConfigError) as caught:
        connector_class("mysqll")
    assert caught.value.hint is not None
    assert caught.value.hint.startswith("did you mean 'mysql'? use one of: ")
