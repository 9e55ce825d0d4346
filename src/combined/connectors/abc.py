"""The connector extension point.

A connector is a class registered under the ``combined.connectors`` entry-point
group. It implements :class:`Source` (usually by subclassing
:class:`BaseSource`). The engine builds it with the source's configuration,
secrets already resolved, at connect time only.

Reading returns an :class:`Extraction`: an iterator of record batches and
state messages bound to one :class:`~combined.protocol.ExtractionAuthority`,
which accepts exactly one terminal outcome once the engine knows whether the
lake commit landed.
"""

from __future__ import annotations

import abc
import difflib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from combined._credentials import is_secret_ref, walk
from combined.errors import ConfigError
from combined.protocol import (
    ExtractionAuthority,
    ExtractionReceipt,
    Message,
    TerminalOutcome,
    TerminalReceipt,
    utcnow,
)

Strategy = Literal["snapshot", "cursor", "cdc"]
SyncMode = Literal["incremental", "append", "full_refresh"]
#: What a cursor read does with rows whose cursor is NULL (no keyset window reaches them):
#: ``fail`` the read, ``include`` them in every read, or ``exclude`` them.
CursorNulls = Literal["fail", "include", "exclude"]


@dataclass(frozen=True, slots=True)
class FieldInfo:
    """One column as the source reports it."""

    name: str
    arrow_type: str
    source_type: str
    nullable: bool = True
    #: What identifies the column at the source across renames (PostgreSQL's
    #: attnum; MariaDB's position and type), or None: renames are not told apart.
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class CursorCandidate:
    """A column that could serve as a cursor, with the evidence for it."""

    column: str
    evidence: str
    #: Whether the source maintains the column when a row is updated (a trigger
    #: that sets it), False when nothing does, None when the connector cannot tell.
    maintained_on_update: bool | None = None


@dataclass(frozen=True, slots=True)
class KeyMeasure:
    """What one query measured about a declared key: is it unique in the relation now."""

    rows: int
    distinct: int  # distinct complete keys (rows with a null key part left out)
    null_keys: int
    query: str
    measured_at: datetime = field(default_factory=utcnow)

    @property
    def unique(self) -> bool:
        """Whether every row has its own complete key."""
        return self.rows == self.distinct and self.null_keys == 0


@dataclass(frozen=True, slots=True)
class KeyCandidate:
    """Columns that could serve as a key where the source declares none, with the evidence."""

    columns: tuple[str, ...]
    evidence: str


@dataclass(frozen=True, slots=True)
class DatasetDiscovery:
    """What a connector knows about one relation of the source."""

    name: str
    relation: str
    kind: str
    fields: tuple[FieldInfo, ...]
    primary_key: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()
    cursor_candidates: tuple[CursorCandidate, ...] = ()
    strategies: tuple[Strategy, ...] = ("snapshot",)
    sync_modes: tuple[SyncMode, ...] = ("incremental", "append", "full_refresh")
    estimated_rows: int | None = None
    #: Keys the data suggests where the source enforces none (files), with evidence.
    key_candidates: tuple[KeyCandidate, ...] = ()
    #: What a user should know before capturing it, one sentence each: that a
    #: read of it includes another listed relation's rows, the files it matched.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Discovery:
    """Everything a connector reported about a source at one time."""

    connector: str
    revision: str
    datasets: tuple[DatasetDiscovery, ...]
    discovered_at: datetime = field(default_factory=utcnow)

    def dataset(self, name: str) -> DatasetDiscovery | None:
        """The discovery of one dataset by name or relation, if reported."""
        for d in self.datasets:
            if d.name == name or d.relation == name:
                return d
        return None


@dataclass(frozen=True, slots=True)
class CursorSpec:
    """A declared cursor: the column, its overlap window, its trust basis, its NULL policy.

    ``nulls`` says what a read does with rows whose cursor is NULL, which no
    window ``lower < cursor <= upper`` reaches: ``fail`` raises
    :class:`~combined.errors.SchemaMismatch` when the relation holds any (a
    column the catalog proves NOT NULL is not checked), ``include`` reads
    them in every read, in the same snapshot, and counts them in the control
    totals, ``exclude`` leaves them out of the read and of the totals.
    """

    column: str
    lookback: Any = None
    trust: str = "declared"
    nulls: CursorNulls = "fail"


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """What the engine asks a connector to read for one dataset.

    ``state`` is the last committed checkpoint (``None`` on a first read).
    ``batch_rows`` bounds each yielded batch. ``bounds`` optionally restricts
    the read to a key or time range (partitioned backfill).
    """

    dataset: str
    relation: str
    key: tuple[str, ...]
    strategy: Strategy
    state: Mapping[str, Any] | None = None
    cursor: CursorSpec | None = None
    columns: tuple[str, ...] | None = None
    batch_rows: int = 65_536
    bounds: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Extraction(Protocol):
    """One source read in progress."""

    @property
    def authority(self) -> ExtractionAuthority:
        """The single owner of this read's receipt."""
        ...

    @property
    def receipt(self) -> ExtractionReceipt:
        """The latest frozen receipt (always read from the authority)."""
        ...

    def __iter__(self) -> Iterator[Message]:
        """Yield record batches and state messages, in source order."""
        ...

    def acknowledge(self, state: Mapping[str, Any]) -> None:
        """Tell the source that the lake commit covering ``state`` is durable.

        Called only after the commit whose checkpoint metadata holds ``state``;
        a CDC read confirms its flush LSN here, other reads ignore it.
        """
        ...

    def finish(self, outcome: TerminalOutcome) -> TerminalReceipt:
        """Accept the one terminal decision; repeats return the first receipt."""
        ...


@runtime_checkable
class Source(Protocol):
    """A connection to a provider system."""

    #: The connector's registered name (``sqlite``, ``postgres``).
    name: ClassVar[str]
    #: The connector's revision, frozen into every Admission.
    revision: ClassVar[str]
    #: Capabilities: which capture strategies this connector implements.
    SUPPORTS_SNAPSHOT: ClassVar[bool]
    SUPPORTS_CURSOR: ClassVar[bool]
    SUPPORTS_CDC: ClassVar[bool]
    #: Whether ``read`` honours ``ReadRequest.bounds`` for partitioned reads.
    SUPPORTS_PARTITIONS: ClassVar[bool]
    #: Whether a read given ``options["control_totals"]`` (True or a column to sum)
    #: reports :attr:`BaseExtraction.control_totals` counted in the read's snapshot.
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool]
    #: Whether a cursor read may hand over again records an earlier read handed
    #: over (at least once: a Singer tap resumes at its bookmark, inclusive).
    #: Such records merge by key; appended, they would be stored twice.
    REDELIVERS: ClassVar[bool]
    #: Whether :meth:`discover` reads the provider's records (an API's first
    #: pages) rather than a catalog. The engine then does not discover before
    #: a capture: it would spend requests, and a failing endpoint of another
    #: dataset would fail this one. The read checks each value against the
    #: dataset's declared fields itself.
    DISCOVERY_READS_RECORDS: ClassVar[bool]
    #: Whether a field's ``identity`` names one column for its whole life
    #: (PostgreSQL's attnum), so a name whose identity changed now names
    #: another column. MariaDB's (position and type) changes with the type.
    IDENTITY_IS_COLUMN: ClassVar[bool]
    #: The configuration keys the connector takes. Any other key is refused by
    #: :func:`check_config` before the configuration is stored or used; None
    #: leaves every check to the connector's constructor.
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None]
    #: The configuration keys whose values others can read (a program's
    #: command line, shown by ``ps``), each with (why, where a secret goes
    #: instead): :func:`check_config` refuses a secret reference under them.
    PUBLIC_KEYS: ClassVar[Mapping[str, tuple[str, str]]]

    def __init__(self, config: Mapping[str, Any]) -> None:
        """Build the source from its configuration, secrets already resolved.

        Raises :class:`~combined.errors.ConfigError` for a configuration it
        cannot take, unknown keys included.
        """
        ...

    def check(self) -> None:
        """Connect and authenticate; raise a ``SourceError`` subclass if impossible."""
        ...

    def discover(self) -> Discovery:
        """Report datasets, fields, keys, cursor candidates and strategies."""
        ...

    def read(self, request: ReadRequest) -> Extraction:
        """Start reading one dataset; nothing is read until the result is iterated."""
        ...

    def close(self) -> None:
        """Release connections held by the source."""
        ...


@runtime_checkable
class PartitionedSource(Protocol):
    """What a source with ``SUPPORTS_PARTITIONS`` offers for parallel backfills.

    A plan exports one snapshot and resolves its bounds and control totals
    inside it; each partition is then read in its own session under that
    snapshot, possibly in parallel.
    """

    def plan_partitions(
        self,
        request: ReadRequest,
        partitions: int,
        column: str | None = None,
        lower: Any = None,
        upper: Any = None,
        sum_column: str | None = None,
    ) -> Any:
        """Export a snapshot and split the relation into ``partitions`` ranges."""
        ...

    def read_partition(self, plan: Any, index: int) -> Extraction:
        """A lazy read of one partition of ``plan`` under its snapshot."""
        ...


class ConfigSink(Protocol):
    """Where a source keeps the configuration updates its provider made (optional).

    A source whose connector may change its own configuration (an Airbyte
    source rotating an OAuth refresh token) has a method
    ``keep_config_updates(sink)``; the engine calls it with a sink that keeps
    each update for the next run (``combined.config._updates``).
    """

    def update(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
        """Keep what ``after`` changed of ``before`` (source configurations, secrets resolved).

        Returns the changed keys' dotted paths, never a value; kept before it
        returns, whatever becomes of the read. Raises a
        :class:`~combined.errors.CombinedError` when the update cannot be kept.
        """
        ...


@dataclass(frozen=True, slots=True)
class StreamOwner:
    """The Combined project whose change streams a source makes on its server (optional).

    A source that makes server objects for its streams (PostgreSQL's slots
    and publications) has a method ``keep_stream_owner(owner)``; the engine
    calls it right after building the source with a function that returns
    the project's owner, asked only when a stream is made, claimed or
    dropped; called with ``make=False`` (by a command that only reads) it
    returns None while the lake holds no id, writing nothing. ``id`` is
    random and kept in the project's lake (``lake/_project.py``): the same
    for every process of the project, and
    after its catalog is rebuilt from the lake. It says nothing of where the
    lake is: what a source writes on a server with it may be readable by
    every role there (a PostgreSQL publication's comment is).
    """

    id: str
    #: Where the source keeps, in the project's lake, what its first captures made
    #: (None when the engine keeps nothing for it).
    records: StreamRecords | None = field(default=None, compare=False, repr=False)


class StreamRecords(Protocol):
    """Records a source keeps in its project's lake about the server objects it made.

    A stream's first capture may die after it made its slot and before the
    lake holds a checkpoint; only the project that made the slot may take the
    slot for its own leftover, and the proof must outlive the process. Each
    record is a small mapping of text, kept under a ``key`` the source
    chooses (letters, digits, ``_``, ``.`` and ``-``), written whole or not
    at all.
    """

    def keep(self, key: str, record: Mapping[str, str]) -> None:
        """Keep ``record`` under ``key``, replacing the one kept there;
        raise a :class:`~combined.errors.CombinedError` when it cannot be kept."""
        ...

    def kept(self, key: str) -> dict[str, str] | None:
        """The record kept under ``key``; None when there is none."""
        ...


@runtime_checkable
class ChangeSource(Protocol):
    """What a source with ``SUPPORTS_CDC`` offers to manage its change streams.

    Each method takes the dataset's relation; the stream itself is read by
    :meth:`Source.read` with strategy ``cdc``.
    """

    def cdc_setup(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Create or verify what the stream needs (publication); say what was done.

        ``committed``: the lake's checkpoint of the dataset (it streamed before).
        """
        ...

    def cdc_status(
        self, relation: str, committed: Mapping[str, Any] | None = None
    ) -> Mapping[str, Any]:
        """The stream's state next to ``committed`` (the lake's checkpoint): position, lag."""
        ...

    def cdc_teardown(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Drop the slot and publication of the relation; say what was dropped.

        ``committed``: the lake's checkpoint of the dataset (it streamed before).
        """
        ...


class BaseExtraction(abc.ABC):
    """Helper base for :class:`Extraction`: one terminal decision, exactly once.

    Subclasses implement :meth:`_messages` (the generator, which must call
    ``self.authority.acquire()`` when it truly starts reading and
    ``complete()`` after proving exhaustion), and may override
    :meth:`_release` to close live source resources; ``retain`` says whether
    durable file evidence must be kept.
    """

    #: Whether a ``cdc`` read yields rows as a snapshot reads them, none a change (a
    #: stitched first snapshot): staging hashes them as it does a snapshot's, and
    #: the reduction streams them as a first baseline (no table of their keys).
    ROWS_ONLY: ClassVar[bool] = False

    def __init__(self, authority: ExtractionAuthority | None = None) -> None:
        self._authority = authority or ExtractionAuthority()
        self._terminal: TerminalReceipt | None = None
        self._terminal_lock = threading.Lock()

    @property
    def authority(self) -> ExtractionAuthority:
        """The single owner of this read's receipt."""
        return self._authority

    @property
    def receipt(self) -> ExtractionReceipt:
        """The latest frozen receipt."""
        return self._authority.receipt

    def __iter__(self) -> Iterator[Message]:
        return self._messages()

    @abc.abstractmethod
    def _messages(self) -> Iterator[Message]:
        """Yield the read's messages."""

    @property
    def control_totals(self) -> Any:
        """Counts the source took in the read's snapshot (``rows``, ``sum_column``, ``sum``).

        None unless the source supports control totals and was asked for them.
        """
        return None

    def null_key_hint(self, columns: Sequence[str]) -> str | None:
        """Why the read may hold NULL in key ``columns`` where the source holds distinct
        values, and what to do; None (the default) when each NULL is the source's own.

        The engine asks it when rows of a capture share a key with NULL in
        ``columns``: its hint then names that cause instead of the source's key.
        """
        return None

    def acknowledge(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Nothing to confirm by default: only change streams hold a position."""

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        """Close live resources; return retained evidence paths. Default: nothing held."""
        return ()

    def finish(self, outcome: TerminalOutcome) -> TerminalReceipt:
        """Accept the first terminal decision and release resources once."""
        with self._terminal_lock:
            if self._terminal is not None:
                return self._terminal
            ok, code = True, None
            retained: tuple[str, ...] = ()
            try:
                retained = self._release(outcome)
            except Exception as exc:  # cleanup never replaces the primary error
                ok, code = False, type(exc).__name__
            self._terminal = TerminalReceipt(
                outcome=outcome,
                decided_at=utcnow(),
                cleanup_succeeded=ok,
                cleanup_error_code=code,
                retained_paths=retained,
                receipt=self._authority.receipt,
            )
            return self._terminal


class BaseSource(abc.ABC):
    """Helper base for :class:`Source` with defaults for capabilities."""

    name: ClassVar[str] = ""
    revision: ClassVar[str] = "0"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = False
    SUPPORTS_CDC: ClassVar[bool] = False
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool] = False
    REDELIVERS: ClassVar[bool] = False
    DISCOVERY_READS_RECORDS: ClassVar[bool] = False
    IDENTITY_IS_COLUMN: ClassVar[bool] = False
    #: Whether a cursor read pages by keyset over (cursor, key): it needs a key.
    CURSOR_NEEDS_KEY: ClassVar[bool] = False
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = None
    PUBLIC_KEYS: ClassVar[Mapping[str, tuple[str, str]]] = {}

    def __init__(self, config: Mapping[str, Any]) -> None:
        check_config(type(self), config)
        self.config = dict(config)

    @abc.abstractmethod
    def check(self) -> None:
        """Connect and authenticate."""

    @abc.abstractmethod
    def discover(self) -> Discovery:
        """Report the source's datasets."""

    @abc.abstractmethod
    def read(self, request: ReadRequest) -> Extraction:
        """Start reading one dataset."""

    def close(self) -> None:  # noqa: B027 - optional hook, most sources hold nothing
        """Release connections; the default holds none."""

    def strategies(self) -> Sequence[Strategy]:
        """The strategies this connector's capabilities allow."""
        return list(supported_strategies(type(self)))

    def warnings(self) -> Sequence[str]:
        """Risks in the configuration that do not stop a read (``combined check`` tells them)."""
        return ()

    def read_warnings(self, requests: Sequence[ReadRequest]) -> Sequence[str]:
        """Risks in the declared reads that do not stop them, asked of the source
        (``combined check`` tells them); a relation missing is left to the check."""
        return ()

    # -- evidence for ``combined plan`` (optional: None where the source cannot say) --------

    def measure_key(self, relation: str, key: Sequence[str]) -> KeyMeasure | None:
        """Rows, distinct key values and rows with a null key part of ``relation``."""
        return None

    def feed_retention(self) -> Mapping[str, Any] | None:
        """How long the source keeps its change feed for a stopped consumer (CDC sources)."""
        return None


def supported_strategies(connector: type[Source]) -> tuple[Strategy, ...]:
    """The capture strategies ``connector``'s capability constants allow."""
    flags: tuple[tuple[Strategy, bool], ...] = (
        ("snapshot", connector.SUPPORTS_SNAPSHOT),
        ("cursor", connector.SUPPORTS_CURSOR),
        ("cdc", connector.SUPPORTS_CDC),
    )
    return tuple(strategy for strategy, supported in flags if supported)


def check_strategy(
    connector: type[Source], strategy: str, *, where: str, key: Sequence[str] | None = None
) -> None:
    """Refuse a dataset whose strategy ``connector`` does not implement, before any read.

    ``where`` names the dataset in the project file (``sources.shop.datasets.orders``);
    ``key``, when given, is its declared key: a cursor the connector pages by
    keyset (``CURSOR_NEEDS_KEY``) needs one, even in an append stream.
    """
    allowed = supported_strategies(connector)
    if strategy not in allowed:
        raise ConfigError(
            f"{where}.strategy is {strategy}, which the {connector.name} connector does not read",
            hint=f"use strategy: {' or '.join(allowed)}",
            connector=connector.name,
            strategy=strategy,
        )
    if strategy == "cursor" and key is not None and not key:
        if getattr(connector, "CURSOR_NEEDS_KEY", False):
            raise ConfigError(
                f"{where} reads by cursor but declares no key, which the {connector.name} "
                "connector pages a cursor by (with the cursor column)",
                hint=f"add `key: [<column>]` under {where} (a unique column, such as the "
                "primary key), or use strategy: snapshot",
                connector=connector.name,
            )


def check_streams(
    connector: type[Source],
    config: Mapping[str, Any],
    datasets: Mapping[str, tuple[str, str]],
    *,
    where: str,
) -> None:
    """Refuse two ``cdc`` datasets that would read one stream of the server's.

    ``datasets``: each dataset's (strategy, relation); ``where``: the source
    in the project file. A connector whose change streams live on the
    server (PostgreSQL's replication slots) names each one with the
    optional classmethod ``cdc_stream(config, relation)``. Two datasets of
    one stream would confirm it for each other: the second one's changes
    are lost when the first one's capture confirms the slot past them.
    """
    stream_of = getattr(connector, "cdc_stream", None)
    if stream_of is None:
        return
    readers: dict[str, str] = {}
    for name, (strategy, relation) in datasets.items():
        if strategy != "cdc":
            continue
        stream = stream_of(config, relation)
        first = readers.setdefault(stream, name)
        if first != name:
            raise ConfigError(
                f"{where}.datasets {first} and {name} both stream relation {relation!r} "
                f"by cdc: they would share the {connector.name} stream {stream}, and each "
                "capture would confirm it past the other's changes (which would be lost)",
                hint="capture the relation by cdc in one dataset only; to keep every "
                "version of its rows as well, give that dataset `history: true`, or "
                "read the other with strategy: snapshot",
                connector=connector.name,
            )


def check_shared_streams(
    connector: type[Source],
    source: str,
    sources: Mapping[str, tuple[Mapping[str, Any], Mapping[str, tuple[str, str]]]],
) -> None:
    """Refuse a ``cdc`` dataset of ``source`` whose server stream another source reads.

    ``sources``: each source of the project with ``connector``, as its
    configuration and its datasets' (strategy, relation). A connector whose
    streams are named server-wide (PostgreSQL's slots: every database of a
    server shares their names) tells the server a configuration names with
    the optional classmethod ``cdc_server(config)``, None when it cannot
    know (a dsn from a secret). Two sources on one server whose datasets
    compute one stream name would confirm one slot for each other, or one
    would take the other's slot for its own leftover and drop it.
    """
    stream_of = getattr(connector, "cdc_stream", None)
    server_of = getattr(connector, "cdc_server", None)
    if stream_of is None or server_of is None:
        return

    def streams(name: str) -> dict[tuple[str, str], tuple[str, str]]:
        config, datasets = sources[name]
        server = server_of(config)
        if server is None:
            return {}
        return {
            (server, stream_of(config, relation)): (dataset, relation)
            for dataset, (strategy, relation) in datasets.items()
            if strategy == "cdc"
        }

    mine = streams(source)
    for other in sorted(sources):
        if other == source:
            continue
        for (server, stream), (dataset, relation) in streams(other).items():
            if (server, stream) not in mine:
                continue
            own, own_relation = mine[(server, stream)]
            first, second = sorted([(source, own, own_relation), (other, dataset, relation)])
            raise ConfigError(
                f"sources {first[0]} (dataset {first[1]}, relation {first[2]!r}) and "
                f"{second[0]} (dataset {second[1]}, relation {second[2]!r}) capture by cdc from "
                f"the {connector.name} server at {server} under one stream name, {stream}: "
                "they would share it (each capture confirming it past the other's changes, "
                "which would be lost), or one would drop the other's",
                hint=f"give {second[0]} (or {first[0]}) a distinct `slot_prefix` in its config",
                connector=connector.name,
            )


def check_config(connector: type[Source], config: Mapping[str, Any], *, where: str = "") -> None:
    """Refuse the keys of ``config`` that ``connector`` does not take (its ``CONFIG_KEYS``),
    and a secret reference under a key whose value others can read (its ``PUBLIC_KEYS``).

    Needs no secret: the engine calls it with references unresolved, before it
    stores the configuration or resolves a secret. ``where`` is the dotted path
    of ``config`` in the project file (``sources.shop.config``), used in errors.
    """
    if connector.CONFIG_KEYS is not None:
        refuse_unknown_keys(connector.name, config, connector.CONFIG_KEYS, where=where)
    public = getattr(connector, "PUBLIC_KEYS", {})
    static = getattr(connector, "check_static", None)
    if static is not None:  # the connector's own checks of what needs no secret
        static(config)
    for loc, value, _ in walk(config):
        if loc[0] in public and is_secret_ref(value):
            why, fix = public[str(loc[0])]
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
            raise ConfigError(
                f"{where or 'config'}{path} holds a secret reference: {why}",
                hint=fix,
                connector=connector.name,
                option=str(loc[0]),
            )


def refuse_unknown_keys(
    connector: str, config: Mapping[str, Any], accepted: Sequence[str], *, where: str = ""
) -> None:
    """Raise :class:`~combined.errors.ConfigError` naming the keys of ``config`` not accepted.

    The hint suggests the closest accepted key and lists them all. A misspelt
    key is never silently dropped: its value may be the setting (or the
    secret) the user meant to give.
    """
    unknown = [str(key) for key in config if key not in accepted]
    if not unknown:
        return
    names = ", ".join(f"{where}.{key}" if where else repr(key) for key in unknown)
    verb = "is not a known key" if len(unknown) == 1 else "are not known keys"
    guesses = []
    for key in unknown:
        close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
        if close:
            guesses.append(f"{close[0]!r}" if len(unknown) == 1 else f"{close[0]!r} for {key!r}")
    if guesses:
        hint = f"did you mean {', '.join(guesses)}? "
    else:
        hint = "remove it; " if len(unknown) == 1 else "remove them; "
    raise ConfigError(
        f"{names} {verb} of the {connector} connector",
        hint=f"{hint}the {connector} connector takes: {', '.join(sorted(accepted))}",
        connector=connector,
        unknown=unknown,
    )


def require_cursor_and_key(request: ReadRequest) -> None:
    """Refuse a cursor read that declares no cursor column or no key (keyset-paged reads)."""
    if request.strategy != "cursor":
        return
    if request.cursor is None:
        raise ConfigError(
            f"dataset {request.dataset!r} reads by cursor but declares none",
            hint="declare the dataset's cursor column",
        )
    if not request.key:
        raise ConfigError(
            f"dataset {request.dataset!r} reads by cursor but declares no key",
            hint="declare a key: it orders each page and makes the lookback harmless",
        )


def refuse_bounds(connector: str, request: ReadRequest, hint: str) -> None:
    """Refuse a read restricted by ``bounds`` in a connector that reads no partitions."""
    if request.bounds is not None:
        raise ConfigError(
            f"the {connector} connector does not read partitions",
            hint=hint,
            dataset=request.dataset,
        )
