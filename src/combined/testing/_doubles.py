"""Test doubles shipped with Combined, so tests never monkeypatch.

Like httpx's ``MockTransport``, these are real connectors that need nothing
running:

* :class:`InMemorySource` (``memory``) serves Arrow tables held in memory and
  can be changed between reads (:meth:`~InMemorySource.put`,
  :meth:`~InMemorySource.delete`, :meth:`~InMemorySource.replace`).
* :class:`ScriptedSource` (``scripted``) plays a script: which rows each read
  yields and when it fails (unavailable, auth rejected, a batch that does not
  fit the discovered schema), including "fail twice, then succeed".

Both honour the extraction protocol exactly as a real connector must: the
receipt is acquired when the first batch is requested, counted per batch,
completed only after the last batch, and a final state message follows.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from combined.connectors.abc import (
    BaseExtraction,
    BaseSource,
    DatasetDiscovery,
    Discovery,
    Extraction,
    FieldInfo,
    ReadRequest,
)
from combined.errors import (
    AuthRejected,
    ConfigError,
    NotFoundError,
    ProtocolViolation,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome

__all__ = ["InMemorySource", "ScriptedSource"]

#: Joins the values of a composite key into one comparable text.
_KEY_SEPARATOR = "\x1f"


class _DoubleExtraction(BaseExtraction):
    """Yields prepared batches under the extraction protocol.

    ``open_read`` runs when the first batch is requested, before the receipt
    is acquired (a failure there means the read never started); the iterable
    it returns may raise part-way through.
    """

    def __init__(
        self,
        dataset: str,
        open_read: Callable[[], Iterable[Any]],
        state: Mapping[str, Any],
        position: str | None = None,
    ) -> None:
        super().__init__()
        self._dataset = dataset
        self._open_read = open_read
        self._state = dict(state)
        self._position = position
        self._guard = threading.Lock()
        self._started = False
        self._finished = False

    def _live(self) -> None:
        if self._finished:
            raise ProtocolViolation(
                "the extraction is finished", hint="start a new read to read again"
            )

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._guard:
            self._finished = True
        return ()

    def _messages(self) -> Iterator[Message]:
        with self._guard:
            self._live()
            if self._started:
                raise ProtocolViolation(
                    "the extraction was already read", hint="start a new read for another pass"
                )
            self._started = True
        batches = self._open_read()
        self.authority.acquire()
        for batch in batches:
            self._live()
            self.authority.count(batch.num_rows, batch.nbytes)
            yield RecordBatchMessage(self._dataset, batch)
        self._live()
        self.authority.complete()
        yield StateMessage(self._dataset, dict(self._state), position=self._position, final=True)


def _check_strategy(source: BaseSource, request: ReadRequest) -> None:
    if request.strategy not in source.strategies():
        raise ConfigError(
            f"the {source.name} source cannot read with strategy {request.strategy!r}",
            hint=f"use one of: {', '.join(source.strategies())}",
            dataset=request.dataset,
        )
    if request.batch_rows < 1:
        raise ConfigError(
            f"batch_rows must be positive, not {request.batch_rows}",
            hint="request at least one row per batch",
            dataset=request.dataset,
        )


def _select(table: Any, request: ReadRequest) -> Any:
    if request.columns is None:
        return table
    missing = [c for c in request.columns if c not in table.column_names]
    if missing:
        raise NotFoundError(
            f"column {missing[0]!r} does not exist in dataset {request.dataset!r}",
            hint="`combined discover SOURCE` lists the dataset's fields",
            dataset=request.dataset,
            column=missing[0],
        )
    return table.select(list(request.columns))


def _fields(schema: Any) -> tuple[FieldInfo, ...]:
    return tuple(FieldInfo(f.name, str(f.type), str(f.type), f.nullable) for f in schema)


def _key_text(table: Any, key: Sequence[str]) -> Any:
    """One text per row standing for its key values, computed column-wise."""
    parts = [pc.cast(table.column(k), pa.string()) for k in key]
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, _KEY_SEPARATOR)


class InMemorySource(BaseSource):
    """A source whose datasets are Arrow tables in memory (snapshot strategy).

    Build it in a test with tables::

        source = InMemorySource(datasets={"orders": table}, keys={"orders": ["id"]})

    or, as the engine does, from a configuration mapping whose ``tables``
    entry maps each dataset to a list of row dicts and whose ``keys`` entry
    maps each dataset to its key columns::

        InMemorySource({"tables": {"orders": [{"id": 1}]}, "keys": {"orders": ["id"]}})

    Each read sees the tables as they were when its first batch was requested;
    :meth:`put`, :meth:`delete` and :meth:`replace` change them between reads.
    """

    name: ClassVar[str] = "memory"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = ("tables", "keys")

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        datasets: Mapping[str, Any] | None = None,
        keys: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        super().__init__(config or {})
        self._lock = threading.Lock()
        self._tables: dict[str, Any] = {}
        for name, rows in (self.config.get("tables") or {}).items():
            self._tables[name] = pa.Table.from_pylist(list(rows))
        self._tables.update(datasets or {})
        self._keys: dict[str, tuple[str, ...]] = {
            name: tuple(cols) for name, cols in (self.config.get("keys") or {}).items()
        }
        self._keys.update({name: tuple(cols) for name, cols in (keys or {}).items()})
        for name, key in self._keys.items():
            table = self._tables.get(name)
            missing = [k for k in key if table is not None and k not in table.column_names]
            if table is not None and table.num_columns and missing:
                raise ConfigError(
                    f"key column {missing[0]!r} is not a column of dataset {name!r}",
                    hint="name key columns that the dataset's rows hold",
                    dataset=name,
                )

    def check(self) -> None:
        """Always reachable: the data is in this process."""

    def discover(self) -> Discovery:
        """Report every dataset with its Arrow fields and declared key."""
        with self._lock:
            tables = dict(self._tables)
        return Discovery(
            connector=self.name,
            revision=self.revision,
            datasets=tuple(
                DatasetDiscovery(
                    name=name,
                    relation=name,
                    kind="table",
                    fields=_fields(table.schema),
                    primary_key=self._keys.get(name, ()),
                    strategies=("snapshot",),
                    estimated_rows=table.num_rows,
                )
                for name, table in sorted(tables.items())
            ),
        )

    def table(self, dataset: str) -> Any:
        """The dataset's current table."""
        with self._lock:
            return self._get(dataset)

    def _get(self, dataset: str) -> Any:
        try:
            return self._tables[dataset]
        except KeyError:
            raise NotFoundError(
                f"dataset {dataset!r} does not exist in the in-memory source",
                hint=f"known datasets: {', '.join(sorted(self._tables)) or 'none'}",
                dataset=dataset,
            ) from None

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a snapshot read; the table is taken when the first batch is requested."""
        _check_strategy(self, request)
        name = request.relation if request.relation in self._tables else request.dataset
        self.table(name)  # unknown names fail now, not mid-capture

        def open_read() -> Iterable[Any]:
            # Tables are immutable and mutations swap them, so holding this
            # reference is a consistent snapshot however the source changes.
            table = _select(self.table(name), request)
            batches: list[Any] = table.to_batches(max_chunksize=request.batch_rows)
            return batches

        return _DoubleExtraction(request.dataset, open_read, {})

    def put(self, dataset: str, rows: Any) -> None:
        """Insert or update rows (a table or row dicts) by the dataset's key.

        Rows whose key is already present replace the old row; without a
        declared key the rows are appended. An unknown dataset is created.
        """
        new = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
        with self._lock:
            current = self._tables.get(dataset)
            if current is None or current.num_columns == 0:
                self._tables[dataset] = new
                return
            key = self._keys.get(dataset, ())
            kept = current
            if key and new.num_rows:
                replaced = pc.is_in(_key_text(current, key), value_set=_key_text(new, key))
                kept = current.filter(pc.invert(replaced))
            self._tables[dataset] = pa.concat_tables([kept, new], promote_options="permissive")

    def delete(self, dataset: str, keys: Iterable[Any]) -> None:
        """Delete rows by key: scalars for a one-column key, tuples or dicts otherwise."""
        with self._lock:
            current = self._get(dataset)
            key = self._keys.get(dataset, ())
            if not key:
                raise ConfigError(
                    f"dataset {dataset!r} has no key, so rows cannot be deleted by key",
                    hint="declare the dataset's key, or replace() the whole table",
                    dataset=dataset,
                )
            rows: list[dict[str, Any]] = []
            for k in keys:
                if isinstance(k, Mapping):
                    rows.append(dict(k))
                elif isinstance(k, tuple | list):
                    rows.append(dict(zip(key, k, strict=True)))
                else:
                    rows.append({key[0]: k})
            if not rows:
                return
            doomed = pa.Table.from_pylist(rows).cast(current.select(list(key)).schema)
            gone = pc.is_in(_key_text(current, key), value_set=_key_text(doomed, key))
            self._tables[dataset] = current.filter(pc.invert(gone))

    def replace(self, dataset: str, table: Any) -> None:
        """Replace the dataset's whole table (or create the dataset)."""
        with self._lock:
            self._tables[dataset] = table


# -- the scripted source ---------------------------------------------------------

_FAILURES = ("unavailable", "auth", "schema", "error")
_STEP_KEYS = frozenset(
    {"rows", "batches", "batch_rows", "fail", "after_batches", "fail_times", "state", "position"}
)
_LIST_DATASET = "items"


def _arrow_type(dataset: str, column: str, spelled: Any) -> Any:
    if isinstance(spelled, pa.DataType):
        return spelled
    try:
        return pa.type_for_alias(str(spelled))
    except (ValueError, KeyError):
        raise ConfigError(
            f"field {column!r} of dataset {dataset!r} has unknown arrow type {spelled!r}",
            hint="use an arrow type name such as int64, double, string, bool, binary",
            dataset=dataset,
        ) from None


def _validate_step(step: Any, where: str) -> dict[str, Any]:
    if not isinstance(step, Mapping):
        raise ConfigError(f"{where} is not a mapping", hint="write each step as a mapping")
    unknown = sorted(set(step) - _STEP_KEYS)
    if unknown:
        raise ConfigError(
            f"{where} has unknown key {unknown[0]!r}",
            hint=f"a step may hold: {', '.join(sorted(_STEP_KEYS))}",
        )
    fail = step.get("fail")
    if fail is not None and fail not in _FAILURES:
        raise ConfigError(
            f"{where} fails with unknown kind {fail!r}",
            hint=f"use one of: {', '.join(_FAILURES)}",
        )
    for name in ("after_batches", "fail_times", "batch_rows"):
        value = step.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ConfigError(
                f"{where} has {name} {value!r}", hint=f"{name} is a non-negative integer"
            )
    return dict(step)


def _expand(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Unroll ``fail_times``: k failing copies of a step, then the step without ``fail``."""
    out: list[dict[str, Any]] = []
    for step in steps:
        times = step.get("fail_times")
        if step.get("fail") is not None and times is not None:
            out.extend(dict(step) for _ in range(times))
            out.append({k: v for k, v in step.items() if k not in ("fail", "fail_times")})
        else:
            out.append(dict(step))
    return out


class _ReadCounter:
    """How many reads each dataset has had, in memory or in a ``state_file``.

    The file exists because the engine builds a fresh source instance from
    configuration for every Attempt (possibly in another worker process): a
    counter held by the instance would restart at zero on every retry, so a
    script that fails twice and then succeeds would fail forever.
    """

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def _load(self) -> dict[str, int]:
        assert self._path is not None
        try:
            data = json.loads(self._path.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): int(v) for k, v in data.get("reads", {}).items()}

    def get(self, dataset: str) -> int:
        with self._lock:
            counts = self._load() if self._path else self._counts
            return counts.get(dataset, 0)

    def take(self, dataset: str) -> int:
        """Count one more read of ``dataset``; return how many came before it."""
        with self._lock:
            if self._path is None:
                n = self._counts.get(dataset, 0)
                self._counts[dataset] = n + 1
                return n
            with _file_lock(self._path):
                counts = self._load()
                n = counts.get(dataset, 0)
                counts[dataset] = n + 1
                # Write then rename: a crash never leaves a half-written count.
                fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=self._path.name)
                with os.fdopen(fd, "w") as f:
                    json.dump({"reads": counts}, f)
                os.replace(tmp, self._path)
                return n


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # Workers in other processes share the count; flock serialises them where
    # the platform has it, and the thread lock above covers this process.
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ScriptedSource(BaseSource):
    """A source that plays a script: what each read yields and when it fails.

    Configuration (or the keyword arguments of the same names)::

        {
          "datasets": {"orders": {"fields": {"id": "int64", "name": "string"},
                                  "key": ["id"]}},
          "script": [step, ...],            # or {"orders": [step, ...], ...}
          "state_file": "/tmp/reads.json",  # optional, see below
          "check": "unavailable",           # optional: make check() fail
        }

    A list script applies to every dataset; a mapping gives each dataset its
    own. ``ScriptedSource([step, ...])`` is short for ``{"script": [...]}``.
    Discovery reports the declared datasets (a dataset without declared
    fields gets the schema of its first scripted rows; a list script with
    nothing declared reports one dataset, ``items``).

    Each call to :meth:`read` consumes the next step of its dataset; the last
    step repeats. A step holds:

    ``rows`` / ``batches``
        Row dicts split into batches of at most ``batch_rows`` (the step's or
        the request's, whichever is smaller), or explicit batches of rows.
    ``fail``
        ``"unavailable"`` raises :class:`~combined.errors.SourceUnavailable`,
        ``"auth"`` raises :class:`~combined.errors.AuthRejected`, ``"error"``
        raises :class:`~combined.errors.SourceError`, each after
        ``after_batches`` batches (0: before the read starts, so the receipt
        is never acquired). ``"schema"`` instead yields, after
        ``after_batches`` batches, a one-row batch whose first non-key column
        has a type that does not fit the discovered schema, and then goes on.
    ``fail_times``
        The step fails on this many reads, then yields its rows normally:
        ``{"rows": [...], "fail": "unavailable", "fail_times": 2}``.
    ``state`` / ``position``
        The final state message (default ``{}``).

    The read count lives in the instance, or in ``state_file`` when given:
    the engine builds a fresh instance from configuration for every Attempt,
    so only a file makes "fail twice, then succeed" survive across Attempts
    (and across worker processes).
    """

    name: ClassVar[str] = "scripted"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = ("datasets", "script", "state_file", "check")

    def __init__(
        self,
        config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        script: Sequence[Mapping[str, Any]]
        | Mapping[str, Sequence[Mapping[str, Any]]]
        | None = None,
        datasets: Mapping[str, Mapping[str, Any]] | None = None,
        state_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, Mapping):
            config = {"script": list(config)}
        merged: dict[str, Any] = dict(config or {})
        if script is not None:
            merged["script"] = script
        if datasets is not None:
            merged["datasets"] = datasets
        if state_file is not None:
            merged["state_file"] = os.fspath(state_file)
        super().__init__(merged)
        raw = self.config.get("script", [])
        self._per_dataset = isinstance(raw, Mapping)
        self._scripts: dict[str | None, list[dict[str, Any]]] = {}
        for name, steps in raw.items() if isinstance(raw, Mapping) else [(None, raw)]:
            where = f"step {{}} of the script of {name!r}" if name else "step {} of the script"
            checked = [_validate_step(s, where.format(i + 1)) for i, s in enumerate(steps)]
            self._scripts[name] = _expand(checked)
        self._schemas, self._keys = self._declared()
        check = self.config.get("check")
        if check is not None and check not in ("unavailable", "auth", "error"):
            raise ConfigError(
                f"check fails with unknown kind {check!r}", hint="use unavailable, auth or error"
            )
        self._counter = _ReadCounter(self.config.get("state_file"))

    def _declared(self) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
        schemas: dict[str, Any] = {}
        keys: dict[str, tuple[str, ...]] = {}
        for name, spec in (self.config.get("datasets") or {}).items():
            fields = spec.get("fields")
            if fields:
                schemas[name] = pa.schema(
                    [(col, _arrow_type(name, col, t)) for col, t in fields.items()]
                )
            keys[name] = tuple(spec.get("key", ()))
        names = list(self._scripts) if self._per_dataset else []
        if not self._per_dataset and not schemas and not keys:
            names = [_LIST_DATASET]
        for name in [*keys, *names]:
            if name is not None and name not in schemas:
                schemas[name] = self._inferred(name)
            keys.setdefault(name, ())
        return schemas, keys

    def _steps(self, dataset: str) -> list[dict[str, Any]]:
        if self._per_dataset:
            return self._scripts.get(dataset, [])
        return self._scripts.get(None, [])

    def _inferred(self, dataset: str) -> Any:
        for step in self._steps(dataset):
            rows = step.get("rows") or [r for b in step.get("batches") or [] for r in b]
            if rows:
                return pa.Table.from_pylist(list(rows)).schema
        return pa.schema([])

    def reads(self, dataset: str) -> int:
        """How many reads of ``dataset`` this script has served so far."""
        return self._counter.get(dataset)

    def check(self) -> None:
        """Succeed, or fail as the ``check`` option says."""
        failure = self.config.get("check")
        if failure is not None:
            raise _failure(failure, "check", -1)

    def discover(self) -> Discovery:
        """Report the declared datasets, their fields and keys."""
        return Discovery(
            connector=self.name,
            revision=self.revision,
            datasets=tuple(
                DatasetDiscovery(
                    name=name,
                    relation=name,
                    kind="table",
                    fields=_fields(schema),
                    primary_key=self._keys.get(name, ()),
                    strategies=("snapshot", "cursor"),
                )
                for name, schema in sorted(self._schemas.items())
            ),
        )

    def read(self, request: ReadRequest) -> Extraction:
        """Consume the dataset's next step and return the read it describes."""
        _check_strategy(self, request)
        steps = self._steps(request.dataset)
        if not steps:
            raise NotFoundError(
                f"the script has no steps for dataset {request.dataset!r}",
                hint="add the dataset to the script",
                dataset=request.dataset,
            )
        n = self._counter.take(request.dataset)
        step = steps[min(n, len(steps) - 1)]
        schema = self._schemas.get(request.dataset)
        if schema is None or not len(schema):
            schema = self._inferred(request.dataset)
        good = self._batches(step, schema, request)
        fail = step.get("fail")
        after = min(step.get("after_batches", 0), len(good))
        key = self._keys.get(request.dataset, ())

        def batches() -> Iterator[Any]:
            for i in range(len(good) + 1):
                if i == after and fail == "schema":
                    yield _select(_misfit(step, schema, key), request)
                elif i == after and fail is not None:
                    raise _failure(fail, request.dataset, n)
                if i < len(good):
                    yield good[i]

        def open_read() -> Iterable[Any]:
            if fail not in (None, "schema") and after == 0:
                raise _failure(fail, request.dataset, n)
            return batches()

        return _DoubleExtraction(
            request.dataset, open_read, step.get("state") or {}, step.get("position")
        )

    @staticmethod
    def _batches(step: Mapping[str, Any], schema: Any, request: ReadRequest) -> list[Any]:
        limit = min(request.batch_rows, step.get("batch_rows") or request.batch_rows)
        groups = step.get("batches")
        if groups is None:
            groups = [step.get("rows") or []]
        out: list[Any] = []
        for rows in groups:
            table = pa.Table.from_pylist(list(rows), schema=schema if len(schema) else None)
            out.extend(b for b in _select(table, request).to_batches(max_chunksize=limit))
        return out


def _misfit(step: Mapping[str, Any], schema: Any, key: Sequence[str]) -> Any:
    """A one-row batch whose first non-key column has a type the schema does not allow."""
    rows = step.get("rows") or [r for b in step.get("batches") or [] for r in b]
    first = dict(rows[0]) if rows else {}
    names = [f.name for f in schema]
    if not names:
        return pa.RecordBatch.from_pylist([{"value": "not a number"}])
    target = next((n for n in names if n not in key), names[0])
    wrong_type = schema.field(target).type
    numeric = pa.types.is_integer(wrong_type) or pa.types.is_floating(wrong_type)
    numeric = numeric or pa.types.is_boolean(wrong_type) or pa.types.is_decimal(wrong_type)
    bad_type, bad_value = (pa.string(), "not a number") if numeric else (pa.int64(), 1)
    arrays = []
    fields = []
    for f in schema:
        if f.name == target:
            arrays.append(pa.array([bad_value], bad_type))
            fields.append(pa.field(f.name, bad_type))
        else:
            arrays.append(pa.array([first.get(f.name)], f.type))
            fields.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _failure(kind: str, dataset: str, read: int) -> SourceError:
    where = "check" if read < 0 else f"read {read + 1} of dataset {dataset!r}"
    if kind == "unavailable":
        return SourceUnavailable(
            f"the scripted source is unavailable ({where})",
            hint="the script fails here on purpose; a retry may succeed",
            dataset=dataset,
        )
    if kind == "auth":
        return AuthRejected(
            f"the scripted source rejected the credentials ({where})",
            hint="the script rejects credentials here on purpose",
            dataset=dataset,
        )
    return SourceError(
        f"the scripted source failed ({where})",
        hint="the script fails here on purpose",
        dataset=dataset,
    )
