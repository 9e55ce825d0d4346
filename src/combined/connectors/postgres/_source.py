"""The PostgreSQL source: check, discover, read, and partitioned backfill."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

from psycopg import sql

from combined._credentials import is_secret_ref
from combined.connectors._shared import cursor_order
from combined.connectors.abc import (
    BaseExtraction,
    BaseSource,
    DatasetDiscovery,
    Discovery,
    KeyMeasure,
    ReadRequest,
    StreamOwner,
    require_cursor_and_key,
)
from combined.connectors.postgres import _catalog as catalog
from combined.connectors.postgres._connect import (
    DEFAULT_SLOT_PREFIX,
    Session,
    Sessions,
    Settings,
)
from combined.connectors.postgres._extract import PartitionRead, PostgresExtraction, ReadOptions
from combined.connectors.postgres._grants import grants, refuse_denied, refuse_unreplicating
from combined.connectors.postgres._identity import identity_hint, require_key_identity
from combined.connectors.postgres._partition import PartitionPlan, check_open, create_plan
from combined.connectors.postgres._preflight import (
    refuse_cursor,
    refuse_order,
    refuse_unreadable,
    refuse_unstreamed,
    refuse_wal_level,
    wal_level_refusal,
)
from combined.connectors.postgres._slot_owner import Claim
from combined.connectors.postgres._tls import cleartext_password_warning
from combined.errors import ConfigError, SchemaMismatch, SourceError
from combined.protocol import utcnow


class PostgresSource(BaseSource):
    """A PostgreSQL database read through the ADBC PostgreSQL driver as Arrow batches.

    Configuration:

    ``dsn``
        ``postgresql://user@host:port/dbname`` or ``host=... dbname=...``,
        without a password (one inside is refused).
    ``password`` (optional)
        The resolved secret. It is joined to the connection string only when
        connecting and scrubbed from every error.
    ``schemas`` (optional, default ``["public"]``)
        The schemas discovery lists.
    ``connect_timeout`` (optional, default 10)
        Seconds before an unreachable server is reported as
        :class:`~combined.errors.SourceUnavailable`.
    ``slot_prefix`` (optional, default ``combined``)
        Prefix of the replication slot and publication of each ``cdc``
        dataset, whose name also carries a digest of the prefix and the
        exact relation (see :mod:`combined.connectors.postgres._stitch`).
        Two projects that capture the same table from one database need
        different prefixes: the second one's first capture is refused,
        naming the first (:mod:`combined.connectors.postgres._slot_owner`).

    Any other key is refused, naming the closest one that is taken.

    Datasets are relations named ``schema.table`` (a bare ``table`` is
    ``public.table``). Every read is one ``REPEATABLE READ READ ONLY``
    transaction; see :mod:`combined.connectors.postgres._extract` for the
    receipt boundaries and the ``options`` a read accepts, and
    :mod:`combined.connectors.postgres._types` for the type mapping.
    """

    name: ClassVar[str] = "postgres"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    SUPPORTS_CDC: ClassVar[bool] = True
    CURSOR_NEEDS_KEY: ClassVar[bool] = True
    SUPPORTS_PARTITIONS: ClassVar[bool] = True
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool] = True
    IDENTITY_IS_COLUMN: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = Settings.KEYS

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.settings = Settings.from_config(config)
        self.slot_prefix = self.settings.slot_prefix
        # Keep the configuration, but never the secret, on the instance.
        super().__init__({k: ("***" if k == "password" else v) for k, v in config.items()})
        self._lock = threading.Lock()
        self._extractions: weakref.WeakSet[PostgresExtraction] = weakref.WeakSet()
        self._plans: weakref.WeakSet[PartitionPlan] = weakref.WeakSet()
        #: Sessions kept between the catalog's reads and each dataset's read.
        self._sessions = Sessions(self.settings)
        self._owner_of: Callable[..., StreamOwner | None] | None = None
        self._owner: StreamOwner | None = None

    def keep_stream_owner(self, owner: Callable[..., StreamOwner | None]) -> None:
        """Take the project whose slots and publications this source makes (abc.StreamOwner)."""
        self._owner_of = owner

    def stream_owner(self, make: bool = True) -> StreamOwner | None:
        """The project the engine named (asked once found), or None when it named none;
        ``make=False``: None too while the lake holds no id (nothing is written)."""
        if self._owner is None and self._owner_of is not None:
            self._owner = self._owner_of(make=make)
        return self._owner

    def _claim(self, committed: Mapping[str, Any] | None, make: bool = True) -> Claim:
        """This project's claim to a relation's slot, resumed when ``committed`` has an LSN
        (``make``: :meth:`stream_owner`'s)."""
        return Claim(self.stream_owner(make), resumed=bool((committed or {}).get("lsn")))

    def warnings(self) -> list[str]:
        """A password that may cross the network in clear text (no TLS required)."""
        why = cleartext_password_warning(self.settings.dsn, self.settings.password)
        return [] if why is None else [why]

    @classmethod
    def check_static(cls, config: Mapping[str, Any]) -> None:
        """Validate the configuration as :meth:`__init__` would, its secrets unresolved."""
        if any(is_secret_ref(v) for k, v in config.items() if k != "password"):
            return  # a dsn from a secret is validated when it is resolved
        Settings.from_config({k: v for k, v in config.items() if k != "password"})

    @classmethod
    def cdc_stream(cls, config: Mapping[str, Any], relation: str) -> str:
        """The replication slot a ``cdc`` dataset of ``relation`` streams (abc.check_streams)."""
        from combined.connectors.postgres._stitch import slot_name

        return slot_name(str(config.get("slot_prefix", DEFAULT_SLOT_PREFIX)), relation)

    @classmethod
    def cdc_server(cls, config: Mapping[str, Any]) -> str | None:
        """The server the source's slots live on, ``host:port`` as its dsn names it
        (abc.check_shared_streams); None when unknown (a dsn from a secret)."""
        from psycopg.conninfo import conninfo_to_dict

        dsn = config.get("dsn")
        if not isinstance(dsn, str):
            return None
        try:
            parts = conninfo_to_dict(dsn)
        except Exception:  # (an invalid dsn is told by the source's own checks)
            return None
        host = str(parts.get("hostaddr") or parts.get("host") or "localhost").lower()
        if host.startswith("/") or host in ("127.0.0.1", "::1", "[::1]"):
            host = "localhost"  # a socket or the loopback: this machine's server
        return f"{host}:{parts.get('port') or 5432}"

    def check(self) -> None:
        """Connect and authenticate; confirm the configured schemas exist.

        Raises :class:`~combined.errors.SourceUnavailable` (unreachable),
        :class:`~combined.errors.AuthRejected` (credentials or login refused)
        or :class:`~combined.errors.ConfigError` (missing database or schema).
        """
        session = self._sessions.take()
        try:
            found = {
                r[0]
                for r in session.rows(
                    sql.SQL(
                        "SELECT nspname::text FROM pg_namespace"
                        " WHERE nspname = ANY(CAST({} AS text[]))"
                    ).format(sql.Literal(list(self.settings.schemas))),
                    "checking schemas",
                )
            }
            missing = [s for s in self.settings.schemas if s not in found]
            if missing:
                raise ConfigError(
                    f"schema {missing[0]!r} does not exist in the postgres database",
                    hint="fix `schemas` in the source configuration",
                )
        finally:
            self._sessions.give_back(session)

    def preflight(self, requests: Sequence[ReadRequest]) -> None:
        """Refuse, before any Run, a read the catalog shows cannot succeed (an uncast interval,
        a range or composite column, a cursor or key that cannot order pages)."""
        session = self._sessions.take()
        try:
            # Every relation, column and type in three queries, not three a dataset.
            rels = catalog.find_relations(session, [r.relation for r in requests])
            columns = catalog.columns(session, [rel.oid for rel in rels])
            types = catalog.load_types(session, {c.typoid for cs in columns.values() for c in cs})
            allowed = grants(session, [rel.oid for rel in rels])
            streamed = [r.dataset for r in requests if r.strategy == "cdc"]
            if streamed:
                (level,) = session.rows(
                    "SELECT current_setting('wal_level')", "reading the server's wal_level"
                )[0]
                refuse_wal_level(str(level), streamed)
            reads: list[tuple[ReadRequest, catalog.Relation, list[str]]] = []
            for r, rel in zip(requests, rels, strict=True):
                cols = columns.get(rel.oid, [])
                cdc = r.strategy == "cdc"
                if cdc:
                    self._refuse_unstreamed(session, r, rel)
                    _refuse_key_outside_identity(session, r)
                casts = {} if cdc else self.settings.casts_for(r.relation)
                plans = catalog.column_plans(cols, types, casts)
                chosen = [p for p in plans if r.columns is None or p.name in r.columns]
                if not plans:  # (its Run failed: "the key must name at least one column")
                    raise ConfigError(
                        f"dataset {r.dataset!r}: {rel.name} has no columns, so no row of it "
                        "can be told from another",
                        hint=f"add a column to {rel.name}, or remove the dataset",
                        dataset=r.dataset,
                    )
                # (The stream carries no generated column: a cdc `columns:` names none.)
                generated = [c.name for c in cols if cdc and c.generated]
                refuse_unreadable(r.dataset, rel.name, chosen, cdc, generated)
                by_name = {p.name: p for p in plans}
                spec = r.cursor
                if r.strategy == "cursor" and spec is not None:
                    order = cursor_order(spec.column, r.key)
                    if all(c in by_name for c in order):  # a name missing: the read says so
                        refuse_cursor(r.dataset, by_name, spec.column)
                        refuse_order(r.dataset, by_name, order)
                reads.append((r, rel, [p.name for p in chosen]))
            # Last, once every dataset's configuration is checked: a capture leaves
            # these to its Run (needs_auth), and tells a misconfigured dataset first.
            for r, rel, names in reads:
                refuse_denied(r.dataset, rel.schema, rel.table, names, allowed.get(rel.oid))
                if r.strategy == "cdc":
                    refuse_unreplicating(r.dataset, allowed.get(rel.oid))
        finally:
            self._sessions.give_back(session)

    def _refuse_unstreamed(self, session: Session, r: ReadRequest, rel: catalog.Relation) -> None:
        """Refuse a cdc dataset of a view, an UNLOGGED table, one without a replica identity,
        an inheritance parent, or a partitioned table a partition of which no slot streams."""
        dataset = r.dataset
        persistence, identity, keyed = session.rows(
            sql.SQL(
                "SELECT c.relpersistence::text, c.relreplident::text, EXISTS (SELECT 1"
                " FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisprimary OR"
                " i.indisreplident)) FROM pg_class c WHERE c.oid = {}"
            ).format(sql.Literal(rel.oid)),
            "reading the table's persistence and replica identity",
        )[0]
        rows = _rows(session, "reading the table's unique indexes")
        fix = partial(identity_hint, rows, rel.schema, rel.table, r.key)
        refuse_unstreamed(dataset, rel.name, rel.kind, persistence, identity, keyed, fix)

        # An inheritance parent, or a partition that is a foreign table or has no
        # replica identity: `combined check` passed them, and every first capture
        # then failed its Run as if a retry could help. Once the table is set up
        # (its publication exists), the capture's own checks tell what changed.
        if rel.children and not self._published(session, rel.name):
            self._refuse_unpublishable(session, dataset, rel)

    def _published(self, session: Session, relation: str) -> bool:
        """Whether the publication of ``relation``'s cdc dataset exists (set up before)."""
        from combined.connectors.postgres._stitch import slot_name

        return bool(
            session.rows(
                sql.SQL("SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = {})").format(
                    sql.Literal(slot_name(self.slot_prefix, relation))
                ),
                "looking up the table's publication",
            )[0][0]
        )

    @staticmethod
    def _refuse_unpublishable(session: Session, dataset: str, rel: catalog.Relation) -> None:
        """Refuse what :func:`check_publishable` refuses, before any Run."""
        # (imported here: a snapshot capture imports no change-capture module)
        from combined.connectors.postgres._tree import check_publishable, read_tree

        tree = read_tree(_rows(session, "reading the table's partitions"), rel.schema, rel.table)
        try:
            if tree is not None:
                check_publishable(tree)
        except SourceError as exc:
            raise ConfigError(
                f"cdc dataset {dataset!r}: {exc.message}", hint=exc.hint, dataset=dataset
            ) from None

    def discover(self) -> Discovery:
        """Relations of the configured schemas with columns, keys and cursor evidence."""
        session = self._sessions.take()
        try:
            at = utcnow()
            rels = catalog.list_relations(session, self.settings.schemas)
            oids = [r.oid for r in rels]
            cols = catalog.columns(session, oids) if oids else {}
            types = catalog.load_types(session, {c.typoid for cs in cols.values() for c in cs})
            idx = catalog.indexes(session, oids) if oids else {}
            trig = catalog.triggers(session, oids) if oids else {}
            datasets = tuple(
                catalog.describe(
                    r,
                    cols.get(r.oid, []),
                    types,
                    idx.get(r.oid, []),
                    trig.get(r.oid, []),
                    self.settings.casts_for(r.name),
                )
                for r in rels
            )
        finally:
            self._sessions.give_back(session)
        return Discovery(self.name, self.revision, datasets, discovered_at=at)

    @staticmethod
    def discovered_name(relation: str) -> str:
        """The name discovery reports ``relation`` by: ``schema.table`` (a bare name is in
        ``public``), so a dataset naming its table bare is found among the discovered ones."""
        return catalog.relation_name(*catalog.parse_relation(relation))

    def describe_relation(self, relation: str) -> DatasetDiscovery:
        """What discovery reports of one relation; :class:`NotFoundError` when it is gone."""
        session = self._sessions.take()
        try:
            rel = catalog.find_relation(session, relation)
            cols = catalog.columns(session, [rel.oid]).get(rel.oid, [])
            types = catalog.load_types(session, {c.typoid for c in cols})
            return catalog.describe(
                rel,
                cols,
                types,
                catalog.indexes(session, [rel.oid]).get(rel.oid, []),
                catalog.triggers(session, [rel.oid]).get(rel.oid, []),
                self.settings.casts_for(rel.name),
            )
        finally:
            self._sessions.give_back(session)

    def read(self, request: ReadRequest) -> BaseExtraction:
        """A lazy read of one relation; nothing touches the server until iterated.

        ``cdc`` reads a stitched snapshot first (slot, exported snapshot, its
        consistent LSN as the state), then the change stream from the
        committed LSN up to the server's position when the read starts.

        ``snapshot`` reads the relation (restricted by ``request.bounds``:
        ``{column, lower (inclusive), upper (exclusive), include_nulls}``);
        ``cursor`` pages by keyset over (cursor, key) up to ``max(cursor)``
        read in the same snapshot, resuming from ``request.state["cursor"]``
        minus the cursor's lookback.
        """
        if request.strategy == "cdc":
            if self.settings.casts_for(request.relation):
                # The change stream decodes each column by its own type: a
                # column cast in the initial snapshot only would change type.
                raise ConfigError(
                    f"casts are declared for {request.relation!r}, which is read by cdc",
                    hint="change data capture reads every column as its own type; remove its "
                    "casts, or capture the relation with the snapshot or cursor strategy",
                )
            # Change capture's modules (psycopg2, the WAL decoder) load only for it.
            from combined.connectors.postgres._stitch import cdc_read

            return cdc_read(self.settings, request, self.slot_prefix, self.stream_owner)
        options = self._validate(request)
        ext = PostgresExtraction(self.settings, request, options, sessions=self._sessions)
        with self._lock:
            self._extractions.add(ext)
        return ext

    def cdc_check(
        self, relations: Sequence[str], committed: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Raise what would stop a capture of each relation's change stream (``_cdc_ready``);
        ``committed``: the checkpoints the lake resumes them from (their slots must exist)."""
        from combined.connectors.postgres._cdc_ready import check_ready
        from combined.connectors.postgres._stitch import slot_name

        for relation in relations:
            # (check only reads: a project that never made a stream has no id yet,
            # and any publication marked is another's)
            claim = self._claim((committed or {}).get(relation), make=False)
            slot = slot_name(self.slot_prefix, relation)
            check_ready(self.settings, slot, relation, claim)

    def cdc_preflight(
        self, relations: Sequence[str], committed: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Refuse, before a Run, the slot a first capture of a relation would refuse in it
        (another database's or project's, or not provably this one's: ``_slot_owner``);
        one ``committed`` resumes (its LSN) is not judged, as its capture does not."""
        from combined.connectors.postgres._cdc_ready import refuse_claimed
        from combined.connectors.postgres._stitch import slot_name

        firsts = [r for r in relations if not (committed or {}).get(r, {}).get("lsn")]
        if firsts:
            # The claim its Run would make: the project's id made if the lake has none yet
            # (a capture writes), so the refusal names it (the mark a person may write).
            claim = Claim(self.stream_owner())
            refuse_claimed(self.settings, [(slot_name(self.slot_prefix, r), claim) for r in firsts])

    def cdc_setup(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Create (or verify) the relation's publication, marked this project's; refuse
        another project's (``_slot_owner``). The slot comes with the first read."""
        from combined.connectors.postgres._publication import ensure_publication
        from combined.connectors.postgres._replication import require_own_slot
        from combined.connectors.postgres._stitch import qualified, slot_name

        name = slot_name(self.slot_prefix, relation)
        require_own_slot(self.settings, name)  # before the publication: nothing left behind
        pub = ensure_publication(
            self.settings,
            name,
            [qualified(relation)],
            add_missing=True,
            claim=self._claim(committed),
        )
        verb = "created" if pub.created else "verified"
        return f"publication {name} {verb} for {qualified(relation)}"

    def cdc_status(
        self, relation: str, committed: Mapping[str, Any] | None = None
    ) -> Mapping[str, Any]:
        """The relation's slot: existence, confirmed position, lag in bytes and seconds;
        ``refused`` (its error and hint) when the server cannot stream it (``wal_level``)."""
        from combined.connectors.postgres._replication import slot_status
        from combined.connectors.postgres._stitch import slot_name

        name = slot_name(self.slot_prefix, relation)
        status = slot_status(self.settings, name)
        out = {"committed_lsn": (committed or {}).get("lsn"), "slot": name, **status.to_json()}
        refusal = wal_level_refusal(status.wal_level)
        if refusal is not None:
            out["refused"] = {"error": refusal.message, "hint": refusal.hint}
        return out

    def cdc_undeclared(self, relations: Sequence[str]) -> list[dict[str, Any]]:
        """Slots named with this source's prefix that no dataset of ``relations`` owns
        (nor another project: ``_slot_owner``)."""
        from combined.connectors.postgres._evidence import undeclared_slots
        from combined.connectors.postgres._stitch import slot_name, slot_name_start

        owned = {slot_name(self.slot_prefix, r) for r in relations}
        start = slot_name_start(self.slot_prefix)
        return undeclared_slots(self.settings, start, owned, self.stream_owner(make=False))

    def cdc_teardown(self, relation: str, committed: Mapping[str, Any] | None = None) -> str:
        """Drop the relation's slot and publication (WAL is no longer retained for it);
        refuse, dropping nothing, another project's or one not provably this one's."""
        from combined.connectors.postgres._publication import drop_publication, require_owned
        from combined.connectors.postgres._replication import drop_slot
        from combined.connectors.postgres._stitch import slot_name

        name = slot_name(self.slot_prefix, relation)
        judged = require_owned(self.settings, name, self._claim(committed))
        slot = judged is not None and drop_slot(self.settings, name, judged=judged)
        pub = drop_publication(self.settings, name)
        return (
            f"slot {name} {'dropped' if slot else 'was absent'}, "
            f"publication {name} {'dropped' if pub else 'was absent'}"
        )

    def measure_key(self, relation: str, key: Sequence[str]) -> KeyMeasure:
        """Rows, distinct key values and rows with a null key part of ``relation``."""
        from combined.connectors.postgres._evidence import measure_key

        return measure_key(self.settings, relation, key)

    def feed_retention(self) -> Mapping[str, Any]:
        """The server's WAL keep settings for slots and its average WAL rate."""
        from combined.connectors.postgres._evidence import wal_retention

        return wal_retention(self.settings)

    def plan_partitions(
        self,
        request: ReadRequest,
        partitions: int,
        column: str | None = None,
        lower: Any = None,
        upper: Any = None,
        sum_column: str | None = None,
    ) -> PartitionPlan:
        """Export one snapshot and split ``request``'s relation into ``partitions`` ranges.

        ``column`` defaults to the single key column, else the cursor column.
        ``lower`` (inclusive) and ``upper`` (exclusive) bound the range; a
        bound left None is resolved as MIN/MAX inside the exported snapshot,
        as are the row count and the sum of ``sum_column`` (the control
        totals). The plan keeps the coordinator transaction open until
        :meth:`PartitionPlan.close`.
        """
        self._validate(request)
        plan = create_plan(self.settings, request, partitions, column, lower, upper, sum_column)
        with self._lock:
            self._plans.add(plan)
        return plan

    def read_partition(self, plan: PartitionPlan, index: int) -> PostgresExtraction:
        """A lazy read of partition ``index`` in its own session, under the plan's snapshot."""
        check_open(plan)
        part = plan.partition(index)
        options = ReadOptions.of(plan.request, self.settings)
        ext = PostgresExtraction(
            self.settings,
            plan.request,
            options,
            PartitionRead(
                snapshot_id=plan.snapshot_id,
                snapshot_text=plan.snapshot_text,
                column=plan.column,
                index=index,
                lower=part.lower,
                upper=part.upper,
                include_nulls=part.include_nulls,
            ),
        )
        with self._lock:
            self._extractions.add(ext)
        return ext

    def close(self) -> None:
        """Close open partition plans and abort extractions that were never finished."""
        with self._lock:
            plans, self._plans = list(self._plans), weakref.WeakSet()
            exts, self._extractions = list(self._extractions), weakref.WeakSet()
        for plan in plans:
            plan.close()
        for ext in exts:
            ext.finish("abort")
        self._sessions.close()

    def _validate(self, request: ReadRequest) -> ReadOptions:
        if request.strategy not in ("snapshot", "cursor"):
            raise ConfigError(
                f"the postgres connector cannot read with strategy {request.strategy!r} yet",
                hint="use snapshot or cursor",
            )
        require_cursor_and_key(request)
        catalog.parse_relation(request.relation)
        return ReadOptions.of(request, self.settings)


def _rows(session: Session, what: str) -> Callable[[sql.Composed], list[tuple[Any, ...]]]:
    """``session``'s rows of a query, ``what`` naming the read in its error."""
    return lambda query: session.rows(query, what)


def _refuse_key_outside_identity(session: Session, request: ReadRequest) -> None:
    """A cdc key its deletes would not carry, refused before any Run: `combined check`
    passed it, and every capture then ended ``needs_review`` saying so."""
    try:
        require_key_identity(_rows(session, "reading the replica identity"), request)
    except SchemaMismatch as exc:
        raise ConfigError(exc.message, hint=exc.hint, dataset=request.dataset) from None
