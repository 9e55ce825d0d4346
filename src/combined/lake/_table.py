"""The Delta commit protocol: idempotent, monotonic, checkpoint-carrying commits."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from combined.errors import CommitAmbiguous, LakeError, ProtocolViolation
from combined.lake._files import LinkedFile, link_data_files, write_data_files
from combined.lake._probe import store_failure
from combined.lake._rewrite import _relative, remove_action, rewrite_actions
from combined.lake._store import LakeStore
from combined.lake._table_schema import _conformed, _retyped, _union
from combined.lake._types import allow_naive_times
from combined.protocol import utcnow

CommitMode = Literal["merge", "append", "overwrite"]
METADATA_KEY = "combined"
#: The key of a maintenance commit's metadata (``compact``, ``vacuum``): it changes no row.
MAINTENANCE = "maintenance"
#: The key of a commit that replaced the rows with a replay's (``combined replay --replace``):
#: it carries no checkpoint and commits no Delivery.
REPLACED = "replaced"
#: A checkpoint every this many versions: a reader loads it and at most as many log entries.
CHECKPOINT_EVERY = 10
#: Tables stay readable by every Delta reader: no deletion vectors, no column mapping.
TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.enableDeletionVectors": "false",
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
}


#: The table loads the pinned views of one block share, by table path (see :func:`shared_loads`).
_SHARED: ContextVar[dict[str, list[Any]] | None] = ContextVar("combined_shared", default=None)


@contextmanager
def shared_loads() -> Iterator[None]:
    """Within the block, the pinned views of a table share one load until a write to it.

    For a Run under its datasets' leases: its steps (catching up, the
    foreign-writer check, extraction, the reduction, reconciliation) each
    ask for a pinned view, and each view cost an object store a listing of
    the table's log and a read of every entry since its last checkpoint
    (ten loads of each dataset's table a capture). A write through a
    :class:`LakeTable` (a commit, an append) ends the shared load: views
    asked for afterwards load the table again. A view already handed out
    keeps its version, as every pinned view does.
    """
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def post_commit() -> Any:
    """What delta-rs does after each of Combined's commits: checkpoint, never cut the log.

    By default, each time delta-rs checkpoints it also removes the log entries
    older than ``delta.logRetentionDuration`` (30 days) before the checkpoint,
    and the versions they describe can no longer be read: a publication made
    at one, or ``explain``'s and ``replay``'s evidence of its commit. Nothing
    leaves the lake but by ``combined maintain``'s recorded decision.
    """
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did: the lake version holding the sequences, or a skip."""

    lake_version: int
    skipped: bool
    committed_at: datetime
    #: The run whose commit holds the sequences (from its metadata); None when
    #: no Combined commit in the table's history covers them.
    run_id: str | None = None


class LakeTable:
    """One dataset's Delta table and its commit protocol.

    Each commit carries ``Transaction(app_id, version=last delivery sequence)``
    and the Run's evidence in ``custom_metadata``. Sequences at or below the
    table's transaction version are already committed and are skipped; a gap
    is refused. A concurrent duplicate loses with a conflict and is then
    resolved by reading the transaction version again.
    """

    def __init__(
        self, path: str | Path, app_id: str, store: LakeStore | None = None, *, small: bool = False
    ) -> None:
        #: The table's location: a local path or an object-store URL.
        self.path = str(path)
        self.app_id = app_id
        self.store = store or LakeStore.at(path)
        #: (``small``: a table of small records, whose requests are bounded tighter)
        self._options = self.store.storage_options(small=small)
        #: A pinned view's one load of the newest version (see :meth:`pinned`).
        self._pin: list[Any] | None = None

    def pinned(self) -> LakeTable:
        """This table as one load of its newest version: every read of the view shares it.

        For a step that reads the table several times (whether it exists, its
        schema, files and committed sequence) and needs one version anyway:
        on an object store each load is a few requests and grows with the
        log since the last checkpoint. A read of an older version, and every
        commit, still loads the table afresh.
        """
        view = LakeTable(self.path, self.app_id, self.store)
        shared = _SHARED.get()
        view._pin = [] if shared is None else shared.setdefault(self.path, [])
        return view

    def forget_shared(self) -> None:
        """End the block's shared load of this table (see :func:`shared_loads`): it is written."""
        if (shared := _SHARED.get()) is not None:
            shared.pop(self.path, None)

    def delta(self, version: int | None = None) -> Any:
        """The ``deltalake.DeltaTable`` (at ``version``), or None before the first commit."""
        return self._open(version)

    def _open(self, version: int | None = None) -> Any:
        if self._pin is None:
            return self._fresh(version)
        if not self._pin:
            self._pin.append(self._fresh())
        dt = self._pin[0]
        if version is None or (dt is not None and int(dt.version()) == version):
            return dt
        return self._fresh(version)

    def _fresh(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        # Loaded first: asking whether the table exists before each load cost
        # an object store a listing of the log, every time, for the one case
        # (before the first commit) where the answer is no.
        try:
            return DeltaTable(self.path, version=version, storage_options=self._options)
        except TableNotFoundError:
            if not DeltaTable.is_deltatable(self.path, storage_options=self._options):
                return None
        # There is a table now: another process made it between the load and the
        # question (its first entry landed), or it cannot be read, which this says.
        return DeltaTable(self.path, version=version, storage_options=self._options)

    def exists(self) -> bool:
        """Whether the table has been created."""
        return self._open() is not None

    def version(self) -> int | None:
        """The newest lake table version, or None before the first commit."""
        dt = self._open()
        return None if dt is None else int(dt.version())

    def committed_sequence(self) -> int:
        """The last delivery sequence the lake holds for this dataset (0 if none)."""
        return _sequence_in(self._open(), self.app_id)

    def files(self, version: int | None = None) -> list[str]:
        """The data files of a table version (no deletion vectors, so files are the rows).

        A local table's files are plain paths, as DuckDB and Arrow open them:
        delta-rs percent-encodes its URIs (a space is ``%20``), which no file
        is named.
        """
        dt = self._open(version)
        return [] if dt is None else _files_of(dt)

    def schema(self, version: int | None = None) -> pa.Schema | None:
        """The table's Arrow schema."""
        dt = self._open(version)
        if dt is None:
            return None
        return pa.schema(dt.schema().to_arrow())

    def commits(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Combined commit metadata, newest first (each with its ``lake_version``).

        ``limit``: of the newest log entries read (maintenance ones included).
        """
        dt = self._open()
        return [] if dt is None else _combined_commits(dt.history(limit))

    def newest_commit(
        self, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """The newest Combined commit (that ``where`` accepts), reading the log from its end.

        The log is read a few entries at a time, not whole: reading a
        table's every commit made each capture's requests grow with its age.
        """
        dt = self._open()
        if dt is None:
            return None
        window, versions = _NEWEST_WINDOW, int(dt.version()) + 1
        while True:
            metas = _combined_commits(dt.history(window))
            found = next((m for m in metas if where is None or where(m)), None)
            if found is not None or window >= versions:
                return found
            window *= 4

    def foreign_versions(self, after: int | None) -> list[int]:
        """Table versions newer than ``after`` that no Combined commit made, oldest first."""
        dt = self._open()
        if dt is None:
            return []
        newer = None if after is None else max(int(dt.version()) - after, 0)
        if newer == 0:
            return []
        return sorted(
            int(entry["version"])
            for entry in dt.history(newer)
            if (after is None or int(entry["version"]) > after) and METADATA_KEY not in entry
        )

    def rows_kept_since(self, version: int) -> bool:
        """Whether every commit after ``version`` was Combined's compaction or vacuum.

        Such commits rewrite or remove files, never a row: the table holds
        the rows it held at ``version``.
        """
        dt = self._open()
        newer = -1 if dt is None else int(dt.version()) - version
        if newer <= 0:
            return newer == 0
        for entry in dt.history(newer):
            if int(entry["version"]) <= version:
                continue
            raw = entry.get(METADATA_KEY)
            meta = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(meta, dict) or meta.get(MAINTENANCE) not in ("compact", "vacuum"):
                return False
        return True

    def latest_commit(self) -> dict[str, Any] | None:
        """The newest commit made by Combined: the authoritative checkpoint."""
        return self.newest_commit()

    def commit(
        self,
        *,
        first_sequence: int,
        last_sequence: int,
        mode: CommitMode,
        data: Callable[[], pa.RecordBatchReader],
        metadata: Mapping[str, Any],
        needs_merge: bool = True,
        before_write: Callable[[], None] | None = None,
        files: Sequence[LinkedFile] | None = None,
        before_log: Callable[[], None] | None = None,
        before_rows: Callable[[bool], None] | None = None,
    ) -> CommitResult:
        """Commit sequences ``first..last`` once; skip them when already committed.

        ``files`` are the finished Parquet files of the sequences with their
        Delta statistics (and sha256): an append with the table's schema links them into the
        table instead of rewriting their rows. Any other commit reads ``data()``.
        ``before_rows`` is told, before any row is written, whether the commit
        makes ``files`` table files as they are (True) or writes rows of its
        own (False). ``before_log`` is called once the data files Combined
        writes itself are in the table's directory, before their log entry (a
        crash test's hook).
        """
        from deltalake.exceptions import CommitFailedError, DeltaError

        self.forget_shared()
        dt = self._fresh()  # checked and written on: a commit between two reads would be missed
        done = _sequence_in(dt, self.app_id)
        if last_sequence <= done:
            return self._skipped(last_sequence)
        if first_sequence != done + 1:
            raise ProtocolViolation(
                f"delivery sequence {first_sequence} does not follow the committed "
                f"sequence {done} of {self.app_id}",
                hint="run `combined repair` to reconcile the catalog with the lake",
            )
        properties = self._properties(metadata, last_sequence)
        # (the Deliveries' own schema when given: linking them reads no row)
        schema = pq.read_schema(files[0][0]) if files else None
        if dt is not None and allow_naive_times(
            dt, schema if schema is not None else data().schema
        ):
            dt = self._fresh()
        if dt is not None and mode == "merge":
            # A column the source dropped stays in the table (Delta drops none):
            # a row the transition replaces holds null there, as its Delivery
            # says, never the old value (delta-rs' update keeps columns the
            # source lacks).
            data = _conformed(dt, data)
        try:
            if before_rows is not None:
                before_rows(self._links_whole(dt, mode, needs_merge, files, schema))
            if before_write is not None:
                before_write()
            self._write(
                dt,
                mode,
                data,
                properties,
                needs_merge=needs_merge,
                files=files,
                schema=schema,
                before_log=before_log,
            )
        except CommitFailedError as exc:
            if _sequence_in(self._fresh(), self.app_id) >= last_sequence:
                return self._skipped(last_sequence)
            raise CommitAmbiguous(
                f"the lake commit of {self.app_id} conflicted: {exc}",
                hint="the commit is retried; the lake's transaction version decides",
            ) from exc
        except DeltaError as exc:
            if "overflowed" not in str(exc):
                raise
            raise LakeError(  # (its panic, in the statistics of a file it writes)
                f"delta-rs cannot write the rows of {self.app_id}: {exc}",
                hint="a date or timestamp past the year 262142 (or before -262143) is beyond "
                "delta-rs' calendar: declare a cast of its column to text",
            ) from exc
        except OSError as exc:
            raise store_failure(
                f"the lake refused the commit of {self.app_id}",
                exc,
                "the next capture (or `combined repair`) projects the commit if it landed, "
                "else captures its rows again",
            ) from exc
        version = self._checkpointed(dt)
        run_id = metadata.get("run_id")
        return CommitResult(
            lake_version=version,
            skipped=False,
            committed_at=utcnow(),
            run_id=None if run_id is None else str(run_id),
        )

    def _checkpointed(self, dt: Any) -> int:
        """The newest version, checkpointed every :data:`CHECKPOINT_EVERY` versions.

        At the versions delta-rs picks (9, 19, ...): tables created with the
        interval in their configuration were checkpointed by it already; older
        ones it would checkpoint every 100 versions. ``dt``, the table the
        commit wrote on, reads only the log entries after it (None: the
        commit created the table).
        """
        if dt is None:
            dt = self._fresh()
        else:
            dt.update_incremental()
        version = int(dt.version())
        interval = dt.metadata().configuration.get("delta.checkpointInterval")
        if (version + 1) % CHECKPOINT_EVERY == 0 and interval != str(CHECKPOINT_EVERY):
            dt.create_checkpoint()
        if (shared := _SHARED.get()) is not None:
            shared[self.path] = [dt]  # the block's later views read the table it committed
        return version

    def _properties(self, metadata: Mapping[str, Any], last_sequence: int) -> Any:
        """The commit's metadata, and the transaction that marks ``last_sequence`` committed."""
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            custom_metadata={METADATA_KEY: json.dumps(dict(metadata), default=str)},
            app_transactions=[Transaction(app_id=self.app_id, version=last_sequence)],
        )

    def _write(
        self,
        dt: Any,
        mode: CommitMode,
        data: Callable[[], pa.RecordBatchReader],
        properties: Any,
        *,
        needs_merge: bool,
        files: Sequence[LinkedFile] | None,
        schema: pa.Schema | None,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """Write the commit's rows by the cheapest way its mode and schema allow
        (``schema``: the Deliveries' own, when ``files`` are given)."""
        from deltalake import write_deltalake

        if files and schema is not None and self._links_whole(dt, mode, needs_merge, files, schema):
            linked = link_data_files(self.path, files, self.store)  # (the Deliveries as they are)
            if dt is None or mode != "overwrite":
                self._add(dt, schema, linked, properties, before_log)
            else:
                self._replace(dt, linked, properties, before_log)
            return
        if (
            mode != "overwrite"
            and dt is not None
            and _retyped(dt, schema if schema is not None else data().schema)
        ):
            self._retype(dt, data, mode, properties, before_log)
        elif mode != "overwrite" and (dt is None or not needs_merge):
            self._append(dt, data(), properties, before_log)
        elif dt is None or mode in ("append", "overwrite") or not needs_merge:
            write_deltalake(
                self.path if dt is None else dt,
                data(),
                mode="overwrite" if mode == "overwrite" else "append",
                # The drift policy approved the capture's schema before this point.
                schema_mode=None
                if dt is None
                else ("overwrite" if mode == "overwrite" else "merge"),
                configuration=TABLE_CONFIGURATION if dt is None else None,
                commit_properties=properties,
                post_commithook_properties=post_commit(),
                storage_options=self._options if dt is None else None,
            )
        elif self._same_schema(dt, data().schema):
            self._rewrite(dt, data, properties, files, schema, before_log)
        else:
            # A widened schema (a column added): every file rewritten in it, streamed,
            # as for a type widened. delta-rs' merge evolving the table's metadata held
            # the table and the transition in memory: a 300k-row table whose cdc
            # backlog added a column peaked at 628 MB, over 400 at any size past that.
            self._retype(dt, data, mode, properties, before_log)

    def _links_whole(
        self,
        dt: Any,
        mode: CommitMode,
        needs_merge: bool,
        files: Sequence[LinkedFile] | None,
        schema: pa.Schema | None,
    ) -> bool:
        """Whether the commit makes ``files`` table files as they are, writing no row.

        An overwrite, or an append that merges nothing into a table of the
        same schema (not retyped), links them; any other commit writes rows.
        """
        if not files or schema is None:
            return False
        if dt is not None and not self._same_schema(dt, schema):
            return False
        if mode == "overwrite" or dt is None:
            return True
        return not needs_merge and not _retyped(dt, schema)

    def _replace(
        self,
        dt: Any,
        adds: list[Any],
        properties: Any,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """An overwrite in the table's schema: every current file removed, ``adds`` added.

        One commit, its rows never rewritten: ``adds`` are the Deliveries
        linked into the table. A file the table holds already (a Delivery
        byte for byte the same, named after its bytes) is kept, neither
        removed nor added again.
        """
        added = {a.path for a in adds}
        current = {_relative(f, self.path, self.store): f for f in _files_of(dt)}
        removes = [
            remove_action(local, self.path, self.store)
            for path, local in current.items()
            if path not in added
        ]
        if before_log is not None:
            before_log()
        dt.create_write_transaction(
            [*removes, *(a for a in adds if a.path not in current)],
            mode="append",
            schema=dt.schema(),
            commit_properties=properties,
            post_commithook_properties=post_commit(),
        )

    def _rewrite(
        self,
        dt: Any,
        data: Callable[[], pa.RecordBatchReader],
        properties: Any,
        files: Sequence[LinkedFile] | None,
        schema: pa.Schema | None,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """A keyed merge in the table's schema: copy-on-write of the files it touches.

        Deliveries whose own columns are the table's are read by their ids
        and operations alone, and become table files as they are where they
        delete nothing (see :func:`rewrite_actions`).
        """
        linked = files if files and schema is not None and self._same_schema(dt, schema) else None
        actions = rewrite_actions(
            self.path,
            _files_of(dt),
            pa.schema(dt.schema().to_arrow()),
            data,
            store=self.store,
            linked=linked,
        )
        if before_log is not None:
            before_log()
        dt.create_write_transaction(
            actions,
            mode="append",
            schema=dt.schema(),
            commit_properties=properties,
            post_commithook_properties=post_commit(),
        )

    def _retype(
        self,
        dt: Any,
        data: Callable[[], pa.RecordBatchReader],
        mode: CommitMode,
        properties: Any,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """Commit a transition whose columns change type: every file rewritten in the new types.

        Delta (delta-rs) widens no column in place, so the table is
        overwritten in one commit: its rows cast to the widened schema (less
        the ones a keyed transition replaces or deletes), then the transition's
        rows (an event stream's all kept).
        """
        from deltalake import Schema

        target = _union(pa.schema(dt.schema().to_arrow()), data().schema)
        try:
            actions = rewrite_actions(
                self.path,
                _files_of(dt),
                target,
                data,
                every_file=True,
                keyed=mode == "merge",
                store=self.store,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise LakeError(
                f"the rows of {self.app_id} cannot be stored in the new column types: {exc}",
                hint="set the dataset's drift policy for this change to `fail`, or capture "
                "a view that casts the column to its former type",
            ) from exc
        if before_log is not None:
            before_log()
        dt.create_write_transaction(
            actions,
            mode="overwrite",
            schema=Schema.from_arrow(target),
            commit_properties=properties,
            post_commithook_properties=post_commit(),
        )

    @staticmethod
    def _same_schema(dt: Any, schema: pa.Schema) -> bool:
        current = pa.schema(dt.schema().to_arrow())
        return [(f.name, f.type) for f in current] == [(f.name, f.type) for f in schema]

    def append_batches(
        self,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        *,
        create: bool,
        metadata: Mapping[str, Any] | None = None,
        read_at: int | None = None,
    ) -> None:
        """Append rows outside the delivery protocol (no delivery sequence), streamed.

        ``read_at``: the table version the rows were computed from. The
        append then lands on that version or not at all: another append made
        with ``read_at`` since then fails it (``CommitFailedError``), and the
        caller computes its rows again from the newer version.
        """
        self.forget_shared()
        dt = None if create else self._written_on(read_at)
        properties = (
            _append_properties(metadata, self._guard(read_at)) if metadata is not None else None
        )
        self._append(dt, pa.RecordBatchReader.from_batches(schema, batches), properties)

    def append_streams(
        self,
        schema: pa.Schema,
        streams: Sequence[Iterator[pa.RecordBatch]],
        *,
        create: bool,
        metadata: Callable[[], Mapping[str, Any]],
        dictionaries: Collection[str] = (),
        read_at: int | None = None,
    ) -> None:
        """Append several streams of rows of ``schema`` in one commit, written two at a time.

        Each stream becomes data files of its own, encoded on its own thread
        (Parquet encoding releases the GIL). ``metadata`` is asked for once
        every stream is written, so it may describe what they held.
        ``dictionaries``: string columns the streams give as dictionary arrays.
        ``read_at``: as for :meth:`append_batches`.
        """
        from concurrent.futures import ThreadPoolExecutor

        self.forget_shared()
        dt = None if create else self._written_on(read_at)
        if dt is not None and not self._same_schema(dt, schema):
            raise ValueError(f"{self.path}: appended rows must have the table's schema")
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="append") as pool:
            written = list(
                pool.map(
                    lambda rows: write_data_files(
                        self.path, schema, rows, self.store, dictionaries
                    ),
                    streams,
                )
            )
        actions = [a for file_actions in written for a in file_actions]
        self._add(dt, schema, actions, _append_properties(metadata(), self._guard(read_at)))

    def _written_on(self, read_at: int | None) -> Any:
        """The load an append outside the delivery protocol writes on: ``read_at``'s.

        A pinned view's own load when it is that version (the rows were
        computed from it: MAR reads its usage table once a commit, not twice),
        else a fresh one. The write moves that load to the version it makes:
        the view reads the table as it left it.
        """
        return self._fresh() if read_at is None else self._open(read_at)

    def _guard(self, read_at: int | None) -> Any:
        """The transaction that makes two appends read at one version conflict, or None.

        delta-rs fails a commit whose transaction's app id a commit landed
        since its read version also carries; a plain append would be
        rebased onto the newer version instead.
        """
        from deltalake import Transaction

        return None if read_at is None else Transaction(app_id=self.app_id, version=read_at + 1)

    def _append(
        self,
        dt: Any,
        reader: pa.RecordBatchReader,
        properties: Any,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """Append by streaming our own data files, then committing their add actions."""
        from deltalake import write_deltalake

        schema = reader.schema
        if dt is not None and not self._same_schema(dt, schema):
            # A widened schema goes through delta-rs, which evolves the table's metadata.
            write_deltalake(
                dt,
                reader,
                mode="append",
                schema_mode="merge",
                commit_properties=properties,
                post_commithook_properties=post_commit(),
            )
            return
        actions = write_data_files(self.path, schema, reader, self.store)
        self._add(dt, schema, actions, properties, before_log)

    def _add(
        self,
        dt: Any,
        schema: pa.Schema,
        actions: list[Any],
        properties: Any,
        before_log: Callable[[], None] | None = None,
    ) -> None:
        """Commit add actions, creating the table from ``schema`` on its first commit."""
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions

        if dt is not None and not actions and properties is None:
            return  # nothing to add and no checkpoint to carry: no commit
        if before_log is not None:
            before_log()
        if dt is None:
            create_table_with_add_actions(
                self.path,
                Schema.from_arrow(schema),
                actions,
                mode="error",
                configuration=TABLE_CONFIGURATION,
                storage_options=self._options,
                commit_properties=properties,
                post_commithook_properties=post_commit(),
            )
        else:
            dt.create_write_transaction(
                actions,
                mode="append",
                schema=dt.schema(),
                commit_properties=properties,
                post_commithook_properties=post_commit(),
            )

    def _skipped(self, sequence: int) -> CommitResult:
        meta = self.newest_commit(
            lambda m: int(m.get("last_sequence", 0)) >= sequence >= int(m.get("first_sequence", 0))
        )
        if meta is not None:
            run_id = meta.get("run_id")
            return CommitResult(
                lake_version=meta["lake_version"],
                skipped=True,
                committed_at=datetime.fromisoformat(meta["ingested_at"]),
                run_id=None if run_id is None else str(run_id),
            )
        version = self.version()
        return CommitResult(lake_version=version or 0, skipped=True, committed_at=utcnow())


def _append_properties(metadata: Mapping[str, Any], guard: Any = None) -> Any:
    """An append's commit properties outside the delivery protocol: its metadata (and guard)."""
    from deltalake import CommitProperties

    return CommitProperties(
        custom_metadata={METADATA_KEY: json.dumps(dict(metadata))},
        app_transactions=None if guard is None else [guard],
    )


#: Log entries read at first when looking for the newest commit (then four times more).
_NEWEST_WINDOW = 8


def _combined_commits(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Combined commits among log entries (newest first), each with its ``lake_version``.

    Maintenance commits (compaction, vacuum) and a replay's replacement
    carry no checkpoint and commit no Delivery: left out.
    """
    out = []
    for entry in entries:
        raw = entry.get(METADATA_KEY)
        if raw is None:
            continue
        meta = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if MAINTENANCE in meta or REPLACED in meta:
            continue
        meta["lake_version"] = int(entry["version"])
        meta["lake_timestamp_ms"] = entry.get("timestamp")
        out.append(meta)
    return out


def _sequence_in(dt: Any, app_id: str) -> int:
    """The last delivery sequence a table snapshot holds for ``app_id`` (0 if none)."""
    if dt is None:
        return 0
    v = dt.transaction_version(app_id)
    return int(v) if v is not None else 0


def _files_of(dt: Any) -> list[str]:
    """A table snapshot's data files, local ones as plain paths (see :meth:`LakeTable.files`)."""
    return [_local(uri) for uri in dt.file_uris()]


def _local(uri: str) -> str:
    """A local file URI (or percent-encoded path) as a path; other URIs unchanged."""
    from urllib.parse import unquote

    if uri.startswith("file://"):
        return unquote(uri.removeprefix("file://"))
    if "://" in uri:
        return uri
    return unquote(uri)
