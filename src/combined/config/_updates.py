"""Updates a connector makes to its own configuration, kept for its next run.

An Airbyte source may send its updated configuration (a ``CONTROL`` message
of type ``CONNECTOR_CONFIG``): typically a rotated OAuth refresh token, the
old one revoked by the provider as soon as the new one was issued. The next
run must start from the new one, or it fails until someone authorises the
connector again.

Only the keys whose value changed are kept, each where the declaration puts it:

- a value declared as a ``file:`` secret reference: the file is rewritten
  atomically (a new 0600 file renamed over it), so the reference now reads
  the new value and nothing else holds it;
- any other (an ``env:`` reference, a plain value, a key the connector added):
  the project's config-update file, ``.combined/config-updates/<source>.json``
  under the project directory (0600, in a 0700 directory). Each entry records
  a digest of the declared value it replaces: when the declaration changes
  (a new token put in the environment by hand), the entry no longer applies
  and the declared value is used again.

Updates are kept the moment the connector sends them, whatever becomes of
the run (see ``docs/airbyte.md``, "Configuration updates"): the provider has
already revoked what they replace. They change no data and no checkpoint.
Values never leave these files: callers are told the dotted paths alone, and
each new value under a credential key is masked wherever Combined shows text.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from combined._credentials import SECRET_KEY, is_credential_key, is_secret_ref, remember_secret
from combined._owner_only import private_dir
from combined.config._secrets import (
    join_path,
    parse_secret_ref,
    resolve_secret,
    resolve_secrets,
)
from combined.errors import ConfigError, SecretError, SourceError

#: Where the updates of each source are kept, under the project directory.
UPDATES_DIR = Path(".combined") / "config-updates"

Path_ = tuple[str, ...]
_ABSENT = object()


def _digest(value: Any) -> str:
    """What an entry remembers of the declared value it replaces (never the value)."""
    text = "absent" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _get(config: Any, path: Path_) -> Any:
    for part in path:
        if not isinstance(config, Mapping) or part not in config:
            return _ABSENT
        config = config[part]
    return config


def _set(config: dict[str, Any], path: Path_, value: Any) -> None:
    for part in path[:-1]:
        inner = config.get(part)
        config[part] = dict(inner) if isinstance(inner, Mapping) else {}
        config = config[part]
    if value is _ABSENT:
        config.pop(path[-1], None)
    else:
        config[path[-1]] = value


def changes(before: Mapping[str, Any], after: Mapping[str, Any], at: Path_ = ()) -> Iterator[Path_]:
    """The paths of the leaves that differ between two configurations (mappings entered)."""
    for key in [*before, *(k for k in after if k not in before)]:
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            yield from changes(old, new, (*at, str(key)))
        elif old != new or type(old) is not type(new):
            yield (*at, str(key))


def _secret_like(path: Path_) -> bool:
    return any(is_credential_key(part) for part in path)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically by a 0600 file holding ``text`` (flushed to disk)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):  # a directory fsync is not possible everywhere
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class ConfigUpdates:
    """The kept configuration updates of one source (see the module's docstring).

    ``declared`` is the source's configuration as declared (secret references
    unresolved). :meth:`apply` gives a run its configuration; :meth:`update`
    (a :class:`~combined.connectors.abc.ConfigSink`) keeps what the connector
    changed in it and tells ``told`` the changed paths and where they were kept.
    """

    def __init__(
        self,
        root: Path,
        source: str,
        declared: Mapping[str, Any],
        told: Callable[[Sequence[str], Sequence[str]], None] | None = None,
    ) -> None:
        self.root = root
        self.source = source
        self.path = root / UPDATES_DIR / f"{source}.json"
        self._declared = declared
        self._told = told

    def apply(self, resolved: Mapping[str, Any]) -> dict[str, Any]:
        """``resolved`` (the declared configuration, secrets resolved) with the kept updates.

        An entry whose declared value changed since it was kept is left out.
        """
        given = dict(resolved)  # _set copies each mapping on an updated path
        for entry in self._entries():
            path = tuple(entry["path"])
            if entry["replaces"] == _digest(_get(resolved, path)):
                _set(given, path, entry["value"] if "value" in entry else _ABSENT)
                if _secret_like(path) and isinstance(entry.get("value"), str):
                    remember_secret(entry["value"])
        return given

    def update(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
        """Keep what ``after`` (the connector's new configuration) changed of ``before``.

        Returns the changed paths; :class:`~combined.errors.SourceError` when
        they cannot be kept (the connector holds the only copy of a new token).
        """
        paths = list(changes(before, after))
        for path in paths:
            value = _get(after, path)
            if isinstance(value, str) and (_secret_like(path) or self._is_ref(path)):
                remember_secret(value)  # masked before anything else can show it
        if not paths:
            return []
        try:
            places = self._keep_all(after, paths)
        except OSError as exc:
            raise self._not_kept(paths, exc.strerror or type(exc).__name__) from None
        names = [join_path(path) for path in paths]
        if self._told is not None:
            self._told(names, places)
        return names

    def _keep_all(self, after: Mapping[str, Any], paths: Sequence[Path_]) -> list[str]:
        """Keep each changed value where its declaration puts it; return where they went."""
        kept = [path for path in paths if not self._rewrite_file(path, _get(after, path))]
        places = ["the files of their file: references"] if len(kept) < len(paths) else []
        if kept:
            self._keep(after, kept)
            places.append(str(self.path))
        return places

    def _not_kept(self, paths: Sequence[Path_], why: str) -> SourceError:
        return SourceError(
            f"the connector of source {self.source!r} updated its configuration "
            f"({', '.join(join_path(p) for p in paths)}) but it could not be kept in "
            f"{self.path}: {why}",
            hint="make the project's .combined directory writable; a rotated credential "
            "the connector sent is lost and the connector may need authorising again",
            source=self.source,
        )

    # -- where each value goes ------------------------------------------------------

    def _is_ref(self, path: Path_) -> bool:
        return is_secret_ref(_get(self._declared, path))

    def _rewrite_file(self, path: Path_, value: Any) -> bool:
        """Write ``value`` into the file of a ``file:`` reference at ``path``; whether it did."""
        declared = _get(self._declared, path)
        if not is_secret_ref(declared) or not isinstance(value, str) or not value:
            return False
        scheme, target = parse_secret_ref(declared[SECRET_KEY])
        if scheme != "file" or "\0" in value:
            return False
        # A link (a secret manager's mount) is followed: the link stays, its target changes.
        file = Path(os.path.realpath(self.root / Path(target).expanduser()))
        # The reader drops one final newline (an editor's): keep the value's own.
        text = value if value.endswith("\r") else value + "\n"
        try:
            write_private(file, text)
        except OSError:
            return False  # a read-only mount: kept in the update file instead
        self._resolved_now(path)
        return True

    def _resolved_now(self, path: Path_) -> None:
        """The declared value at ``path`` was rewritten: an entry kept for it goes."""
        if not self.path.exists():
            return
        with self._locked():
            entries = self._entries()
            kept = [e for e in entries if tuple(e["path"]) != path]
            if len(kept) != len(entries):
                self._write(kept)

    def _declared_value(self, path: Path_) -> Any:
        """The declared value at ``path``, its references resolved, as :meth:`apply` sees it."""
        node: Any = self._declared
        try:
            for part in path:
                if not isinstance(node, Mapping) or part not in node:
                    return _ABSENT
                node = node[part]
                if is_secret_ref(node):
                    node = resolve_secret(node[SECRET_KEY], self.root)
            return resolve_secrets(node, self.root) if isinstance(node, Mapping) else node
        except SecretError:
            return _ABSENT  # unreadable now: the entry will not match it, nor be applied

    def _keep(self, config: Mapping[str, Any], paths: Sequence[Path_]) -> None:
        with self._locked():
            entries = {tuple(e["path"]): e for e in self._entries()}
            for path in paths:
                replaces = _digest(self._declared_value(path))
                entry: dict[str, Any] = {"path": list(path), "replaces": replaces}
                value = _get(config, path)
                if value is not _ABSENT:
                    entry["value"] = value
                entries[path] = entry
            self._write(list(entries.values()))

    # -- the update file ------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.path.parent)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _entries(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unreadable(exc.strerror or type(exc).__name__) from None
        try:
            body = json.loads(text)
            entries = body["updates"]
            assert isinstance(entries, list)
            assert all(
                isinstance(e["path"], list) and isinstance(e["replaces"], str) for e in entries
            )
        except (ValueError, KeyError, TypeError, AssertionError):
            raise self._unreadable("it is not a config-update file") from None
        return entries

    def _unreadable(self, why: str) -> ConfigError:
        return ConfigError(
            f"the configuration updates of source {self.source!r} cannot be read from "
            f"{self.path}: {why}",
            hint="restore the file, or remove it to run with the declared configuration "
            "(a rotated credential it held must then be declared again)",
            source=self.source,
        )

    def _write(self, entries: list[dict[str, Any]]) -> None:
        private_dir(self.path.parent)
        body = {"version": 1, "source": self.source, "updates": entries}
        write_private(self.path, json.dumps(body, indent=1, sort_keys=True) + "\n")
