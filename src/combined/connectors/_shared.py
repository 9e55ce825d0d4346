"""Helpers shared by the SQL connectors (PostgreSQL, MariaDB, and SQLite where it reads alike)."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_FLOOR, Decimal, localcontext
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import pyarrow as pa

from combined.connectors.abc import BaseExtraction, ReadRequest
from combined.errors import (
    CombinedError,
    ConfigError,
    NotFoundError,
    ProtocolViolation,
    SchemaMismatch,
)
from combined.protocol import (
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
    TerminalOutcome,
)


class Closable(Protocol):
    """A session whose ``close`` returns its failure instead of raising."""

    def close(self) -> BaseException | None:
        """Close; return the first failure."""
        ...


class Transaction(Closable, Protocol):
    """A session that runs statements of its own transaction (``COMMIT``)."""

    def run(self, query: str, doing: str) -> None:
        """Execute a statement that returns no rows."""
        ...


@dataclass(frozen=True, slots=True)
class ControlTotals:
    """Counts read inside the capture's snapshot: rows, and the exact sum of one column."""

    rows: int
    sum_column: str | None = None
    sum: str | None = None


class Named(Protocol):
    """A column's read plan: anything with the column's name."""

    @property
    def name(self) -> str:
        """The column's name in the source."""
        ...


P = TypeVar("P", bound=Named)


def select_plans(
    plans: Sequence[P],
    request: ReadRequest,
    relation: str,
    *,
    noun: str = "relation",
    also: Sequence[str] = (),
) -> tuple[dict[str, P], list[P]]:
    """The plans by name, and those the read selects (all when it names no columns).

    The key, the cursor and ``also`` must exist too, even when not selected,
    since the read orders or bounds by them. Raises
    :class:`~combined.errors.NotFoundError` for the first missing name, naming
    the ``noun`` (``relation`` or ``table``) it is missing from.
    """
    by_name = {p.name: p for p in plans}
    wanted = [*(request.columns or ()), *request.key]
    if request.cursor is not None:
        wanted.append(request.cursor.column)
    wanted.extend(also)
    missing = [c for c in wanted if c not in by_name]
    if missing:
        raise NotFoundError(
            f"column {missing[0]!r} does not exist in {noun} {relation!r}",
            hint=f"`combined discover SOURCE` lists the {noun}'s columns",
            relation=relation,
            column=missing[0],
        )
    if request.columns is None:
        return by_name, list(plans)
    return by_name, [by_name[c] for c in dict.fromkeys(request.columns)]


def cdc_values(messages: Iterator[Message]) -> Iterator[Message]:
    """A cdc dataset's read: a value it cannot hold names what cdc allows, not a cast.

    A snapshot's refusal of a value (an infinite date, a 30-hour TIME, an
    unmapped type) says to declare a cast; a cdc dataset refuses casts, since
    its stream reads every column as its own type. Such a dataset can leave
    the column out instead (its ``columns:``, which the stream honours too).
    """
    try:
        yield from messages
    except CombinedError as exc:
        column = exc.context.get("column")
        if column and exc.hint and "casts" in exc.hint:
            zero = "zero_dates: null" in exc.hint  # MariaDB's zero dates: that option stays
            exc.hint = (
                ("set zero_dates: null to read zero dates as nulls; " if zero else "")
                + f"a cdc dataset takes no casts: leave {column!r} out of the dataset's "
                "`columns:`, or capture the relation with the snapshot or cursor strategy; "
                f"if an ALTER TABLE changed the type of {column!r} after this change was made, "
                "take a new snapshot (`combined cdc teardown`, then `combined cdc setup`)"
            )
        raise


class SQLReadOptions(NamedTuple):
    """The read options the SQL connectors share, validated."""

    casts: dict[str, str]
    batch_bytes: int
    page_rows: int
    control_totals: bool | str


def sql_read_options(
    request: ReadRequest, casts: Any, *, batch_bytes: int, page_rows: int
) -> SQLReadOptions:
    """Validate ``casts`` (as the connector resolved it) and ``request``'s shared options.

    ``batch_bytes`` and ``page_rows`` (positive integers, defaulting to the
    given values), ``control_totals`` (true or a column name) and the
    request's ``batch_rows`` (positive). Raises
    :class:`~combined.errors.ConfigError` for the first that is wrong.
    """
    opts = request.options
    if not isinstance(casts, Mapping):
        raise ConfigError("`casts` must map column names to types", hint='{"col": "text"}')
    nums = {}
    for key, default in (("batch_bytes", batch_bytes), ("page_rows", page_rows)):
        value = opts.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"`{key}` must be a positive integer", hint=f"e.g. {default}")
        nums[key] = value
    control = opts.get("control_totals", False)
    if not isinstance(control, bool | str):
        raise ConfigError("`control_totals` must be true or a column name", hint="true")
    if request.batch_rows < 1:
        raise ConfigError("batch_rows must be positive", hint="e.g. 65536")
    return SQLReadOptions(dict(casts), nums["batch_bytes"], nums["page_rows"], control)


def casts_by_relation(value: Any, connector: str) -> dict[str, dict[str, str]]:
    """A source's ``casts`` option, ``{"table.column": type}``, grouped by relation.

    The relation is everything before the last dot (``orders`` or
    ``sales.orders``), so ``{"sales.orders.total": "text"}`` gives
    ``{"sales.orders": {"total": "text"}}``; a column whose name holds a dot
    is quoted (``sales.orders."unit.price"``, MariaDB's with backticks).
    Raises ConfigError for anything else.
    """
    if value is None:
        return {}
    example = 'for example casts: {"orders.legacy_date": "text"}'
    if not isinstance(value, Mapping):
        raise ConfigError(f"{connector} `casts` must map table.column to a type", hint=example)
    out: dict[str, dict[str, str]] = {}
    quote = "`" if connector in ("mariadb", "mysql") else '"'
    for key, cast in value.items():
        table, dot, column = _split_cast_key(str(key), quote)
        if not dot or not table or not column or not isinstance(cast, str):
            raise ConfigError(
                f"{connector} cast {key!r} must be written table.column: type", hint=example
            )
        out.setdefault(table, {})[column] = cast
    return out


def _split_cast_key(key: str, quote: str) -> tuple[str, str, str]:
    """``key`` as (relation, ".", column): the column after the last dot, or quoted.

    A column name holding a dot was cut at its own dot and the cast silently
    filed under a relation that does not exist.
    """
    at = key.find("." + quote)
    while at >= 0:
        rest = key[at + 1 :]
        inner = rest[1:-1]
        if len(rest) > 1 and rest.endswith(quote) and quote not in inner.replace(quote * 2, ""):
            return key[:at], ".", inner.replace(quote * 2, quote)
        at = key.find("." + quote, at + 1)
    return key.rpartition(".")


def cast_key(relation: str, column: str, quote: str = '"') -> str:
    """The ``casts`` key of ``column`` of ``relation`` as a JSON string, for a hint.

    A column holding a dot or starting with ``quote`` is quoted (``quote``
    doubled inside), as :func:`casts_by_relation` reads it back.
    """
    if "." in column or column.startswith(quote):
        column = quote + column.replace(quote, quote * 2) + quote
    return json.dumps(f"{relation}.{column}", ensure_ascii=False)


def unreadable_column_fix(
    relation: str,
    columns: Sequence[str],
    *,
    cdc: bool,
    quote: str = '"',
    kept: Sequence[str] | None = None,
) -> str:
    """The hint of ``columns`` a read cannot take as themselves: cast them all, or leave
    them all out, in one edit.

    ``kept``: the dataset's other columns, given as the ``columns:`` list
    that leaves these out (no such list when none would be left; the bare
    key word when not known). A change data capture takes no casts.
    """
    one = len(columns) == 1
    them, their, a_cast = ("it", "its", "a cast") if one else ("them", "their", "casts")
    listed = "`columns:`" if kept is None else f"`columns: {_flow(kept)}`"
    leave = f"leave {them} out with the dataset's {listed}"
    if cdc:
        return (
            f"change data capture reads each column as its own type: {leave}, or capture "
            f"{them} with strategy snapshot or cursor and {a_cast}"
        )
    casts = ", ".join(f'{cast_key(relation, c, quote)}: "text"' for c in columns)
    return f"declare casts: {{{casts}}} in the source configuration to read {their} text form" + (
        f" (or {leave})" if kept is None or kept else ""
    )


def _flow(names: Sequence[str]) -> str:
    """``names`` as a YAML flow list, each quoted as JSON (``on`` or ``a b`` stays a name)."""
    return "[" + ", ".join(json.dumps(n, ensure_ascii=False) for n in names) + "]"


def split_qualified(text: str, quote: str, hint: str) -> list[str]:
    """``a.b`` as its parts (one or two); ``quote`` quotes a part, doubled inside it.

    Raises :class:`~combined.errors.ConfigError` with ``hint`` for an empty
    part, an unclosed quote or more than two parts.
    """
    parts: list[str] = []
    buf: list[str] = []
    i, quoted = 0, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == quote and text[i + 1 : i + 2] == quote:
                buf.append(quote)
                i += 1
            elif ch == quote:
                quoted = False
            else:
                buf.append(ch)
        elif ch == quote and not buf:
            quoted = True
        elif ch == ".":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    if quoted or not all(parts) or len(parts) > 2:
        raise ConfigError(f"{text!r} is not a relation name", hint=hint)
    return parts


_SettingsT_co = TypeVar("_SettingsT_co", covariant=True)
_SettingsT = TypeVar("_SettingsT")


class SettingsSession(Closable, Protocol[_SettingsT_co]):
    """A closable session that keeps the settings it was opened with."""

    @property
    def settings(self) -> _SettingsT_co:
        """The settings the session was opened with (they scrub its errors)."""
        ...


def close_quietly(
    session: SettingsSession[_SettingsT] | None,
    primary: BaseException | None,
    detail: Callable[[BaseException, _SettingsT], str],
) -> BaseException | None:
    """Close ``session``; a failure becomes a note on ``primary``, never raised.

    The note is ``detail(failure, session.settings)``: the connector's
    redacted one-line description of a driver error.
    """
    if session is None:
        return None
    settings = session.settings
    failure = session.close()
    if failure is not None and primary is not None:
        with contextlib.suppress(Exception):
            primary.add_note("cleanup also failed: " + detail(failure, settings))
    return failure


S = TypeVar("S", bound=Closable)

#: Seconds between the cancel requests an abort sends while a statement holds its read.
CANCEL_EVERY_S = 1.0


class SessionRead(BaseExtraction, Generic[S]):
    """A single-use read over one source session: claimed once, refused once finished.

    Subclasses open ``self._session`` when reading starts, hold ``self._lock``
    around every use of it, and call :meth:`_abandon` when the read stops early.
    ``close_quietly`` closes a session, noting a failure on the primary error.
    """

    def __init__(
        self,
        authority: ExtractionAuthority,
        close_quietly: Callable[[S | None, BaseException | None], BaseException | None],
    ) -> None:
        super().__init__(authority)
        self._lock = threading.RLock()
        self._session: S | None = None
        self._claimed = False
        self._finished = False
        self._cleanup_failure: BaseException | None = None
        self._close_session_quietly = close_quietly

    def _live(self) -> S:
        session = self._session
        if self._finished or session is None:
            raise ProtocolViolation(
                "the extraction is finished", hint="start a new read to read again"
            )
        return session

    def _claim(self) -> None:
        with self._lock:
            if self._finished:
                raise ProtocolViolation(
                    "the extraction is finished", hint="start a new read to read again"
                )
            if self._claimed:
                raise ProtocolViolation(
                    "the extraction was already read", hint="start a new read for another pass"
                )
            self._claimed = True

    def _abandon(self, primary: BaseException | None) -> None:
        with self._lock:
            session, self._session = self._session, None
        failure = self._close_session_quietly(session, primary)
        if failure is not None:
            self._cleanup_failure = failure

    def _cancel_statement(self, session: S) -> None:
        """Ask the source to end the statement ``session`` is blocked in, from another
        thread (a connector that can: PostgreSQL, MariaDB); by default nothing."""

    def _stop_statement(self) -> None:
        """End the statement another thread is blocked in, so an abort need not wait for it.

        An Attempt's deadline or a cancel finishes the read from another
        thread, while the reading thread holds the lock inside a statement
        that may never return (a view's function sleeping, a lock the source
        waits on): the source is asked to cancel it until the lock is free.
        The read is marked finished first, so the reading thread starts no
        other statement once this one ended.
        """
        self._finished = True
        held = self._lock.acquire(blocking=False)
        while not held:  # (asked at once, then every CANCEL_EVERY_S until the lock is free)
            session = self._session
            if session is not None:
                self._cancel_statement(session)
            held = self._lock.acquire(timeout=CANCEL_EVERY_S)
        self._lock.release()

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        """Finish: close the session if the read left it open, then report cleanup."""
        if outcome != "success":
            self._stop_statement()
        with self._lock:
            self._finished = True
            session, self._session = self._session, None
        if session is not None:
            failure = session.close()  # an open read ends with its session
            if failure is not None:
                raise failure
        if self._cleanup_failure is not None:
            raise self._cleanup_failure
        return ()  # a read keeps no file evidence

    def _commit_and_close(
        self,
        session: Transaction,
        give_back: Callable[[Any], BaseException | None] | None = None,
    ) -> None:
        """Commit the read transaction and close ``session``: every row is read.

        ``give_back`` takes a committed session instead (the source keeps it
        for its next read). A failure here is cleanup, kept for
        :meth:`finish` to report, never raised.
        """
        committed = True
        try:
            session.run("COMMIT", "committing the read transaction")
        except CombinedError as exc:  # every row is read: a failed close is cleanup
            self._cleanup_failure = exc
            committed = False
        with self._lock:
            self._session = None
        failure = give_back(session) if committed and give_back else session.close()
        if failure is not None:
            self._cleanup_failure = self._cleanup_failure or failure


# -- cursor reads -------------------------------------------------------------


def check_lookback(column: str, lookback: Any) -> None:
    """Refuse a cursor lookback that is not a number or a timedelta, or is negative."""
    if isinstance(lookback, bool) or not isinstance(lookback, int | float | Decimal | timedelta):
        raise ConfigError(
            f"the lookback of cursor {column!r} must be a number or a timedelta",
            hint="a number for numeric cursors, a timedelta (or seconds) for time cursors",
        )
    if (isinstance(lookback, timedelta) and lookback < timedelta(0)) or (
        not isinstance(lookback, timedelta) and lookback < 0
    ):
        raise ConfigError(
            f"the lookback of cursor {column!r} is negative",
            hint="state the lookback as a positive window",
        )


def null_cursor_error(relation: str, column: str, rows: int) -> SchemaMismatch:
    """The error of a cursor read (``nulls: fail``) over a relation with NULL cursor values.

    No window ``lower < cursor <= upper`` ever reaches such a row: read on,
    the capture would lose it, and control totals bounded the same way would
    not notice.
    """
    some = f"1 row of {relation!r} holds" if rows == 1 else f"{rows} rows of {relation!r} hold"
    return SchemaMismatch(
        f"{some} null in cursor column {column!r}, which no cursor read reaches: nothing was read",
        hint="set cursor.nulls: include to read them in every capture, or cursor.nulls: "
        "exclude to leave them out (or make the column NOT NULL at the source)",
        relation=relation,
        column=column,
        rows=rows,
    )


def time_window(lookback: timedelta | float | Decimal) -> timedelta:
    """A checked lookback of a time cursor as a window (a number counts seconds)."""
    return lookback if isinstance(lookback, timedelta) else timedelta(seconds=float(lookback))


def numeric_lookback(column: str, lookback: Any) -> Any:
    """A checked lookback of a numeric cursor; a timedelta is refused."""
    if isinstance(lookback, timedelta):
        raise ConfigError(
            f"cursor {column!r} holds numbers, so its lookback cannot be a timedelta",
            hint="state the lookback in the cursor's own unit",
        )
    return lookback


def lower_by(last: int | float | Decimal, step: int | float | Decimal) -> int | float | Decimal:
    """``last - step`` for a numeric cursor, never above the exact difference.

    Floating point would round ``2**63 - 200 - 2.0`` up to ``2**63``: a bound
    above the checkpoint, an empty window and a cursor that never moves. An
    integer cursor stays an integer (the step rounded up, a window at least as
    wide as declared), a decimal one a decimal, and a float is stepped down
    past any rounding.
    """
    if not isinstance(step, int) and not (
        step.is_finite() if isinstance(step, Decimal) else math.isfinite(step)
    ):
        raise ConfigError(
            f"the cursor lookback {step!r} is not a finite number",
            hint="state the lookback as a finite window in the cursor's own unit",
        )
    if isinstance(last, int) and not isinstance(last, bool):
        return last - (step if isinstance(step, int) else math.ceil(step))
    # Decimal arithmetic rounds to its context: rounded down, never above.
    with localcontext(prec=100, rounding=ROUND_FLOOR):
        if isinstance(last, Decimal):
            return last - Decimal(str(step))
        exact = Decimal(last) - Decimal(str(step))
        lower = float(exact)  # the nearest float: one step down at most
        return math.nextafter(lower, -math.inf) if Decimal(lower) > exact else lower


#: One condition on one ordering column: (column position, operator, value);
#: the operator is one of ``=``, ``>``, ``<``, ``is null``, ``is not null``
#: (``value`` is None for the last two).
KeysetAtom = tuple[int, str, Any]


def keyset_terms(
    values: Sequence[Any], *, after: bool, nulls_first: bool
) -> list[list[KeysetAtom]]:
    """The rows strictly after (``after``) or at or before ``values``, as an OR of ANDs.

    The order is every column ascending, with NULLs sorted first or last as
    ``nulls_first`` says (what the server's ``ORDER BY`` does): a NULL in
    ``values`` or in a row compares as the sort puts it, never as unknown, so
    no row is lost at a page edge whose key holds a NULL. An empty list is
    "no row".
    """

    def same(i: int) -> KeysetAtom:
        return (i, "is null", None) if values[i] is None else (i, "=", values[i])

    def beyond(i: int, later: bool) -> list[KeysetAtom]:
        # Each atom alone: the ways column i can sort strictly later (or earlier).
        v = values[i]
        nulls_beyond = nulls_first != later  # NULLs sort on that side of every value
        if v is None:
            return [] if nulls_beyond else [(i, "is not null", None)]
        atoms: list[KeysetAtom] = [(i, ">" if later else "<", v)]
        return [*atoms, (i, "is null", None)] if nulls_beyond else atoms

    terms = [
        [*(same(j) for j in range(i)), atom]
        for i in range(len(values))
        for atom in beyond(i, after)
    ]
    if not after:
        terms.append([same(j) for j in range(len(values))])
    return terms


def cursor_order(cursor: str, key: Sequence[str]) -> list[str]:
    """The columns that order a cursor read's pages: the cursor, then the key."""
    return [cursor, *[k for k in key if k != cursor]]


def new_to_lake(request: ReadRequest, columns: Iterable[str]) -> list[str]:
    """The ``columns`` a read selects that the lake lacks (``lake_columns``): added since.

    A cursor read whose source filled such a column below its checkpoint
    (a column added with a default, or renamed) reads again from the first
    row: past the checkpoint alone, the older rows kept NULL in the lake.
    """
    known = request.options.get("lake_columns")
    return [] if known is None else [c for c in columns if c not in known]


def tie_free(
    order: Sequence[str], keys: Iterable[Sequence[str]], exact: Callable[[str], bool]
) -> bool:
    """Whether no two rows can tie on ``order``, so that plain keyset pages are exact.

    ``keys`` are the relation's unique keys over NOT NULL columns (its
    primary key among them); one of them must lie within ``order``, each of
    its columns ordered and compared as itself (``exact``): a column read
    through another expression (text, another collation) may tie where the
    column cannot.
    """
    within = set(order)
    return any(key and set(key) <= within and all(exact(c) for c in key) for key in keys)


def keyset_pages(
    page: Callable[[list[Any] | None, list[Any] | None], Iterator[pa.RecordBatch]],
    order: Sequence[str],
    page_rows: int,
    dataset: str,
    *,
    edge: Callable[[list[Any] | None], list[Any] | None] | None = None,
) -> Generator[Message, None, int]:
    """Hand over keyset pages of about ``page_rows`` rows; return how many rows were read.

    Without ``edge``, ``page(after, None)`` streams at most ``page_rows`` rows
    ordered by ``order``: those strictly after the values ``after`` of those
    columns (``None`` for the first page); a short page proves the range
    exhausted. That is exact only where no two rows tie on ``order`` (a
    unique, NOT NULL key among its columns): a row tied with a page's last
    row would be skipped.

    With ``edge``, ``edge(after)`` returns the ``order`` values of the
    ``page_rows``-th row after ``after`` (None when fewer rows remain), and
    ``page(after, upto)`` streams every row after ``after`` and at or before
    ``upto`` (to the end when ``upto`` is None), whatever their count: rows
    that tie with the edge (equal values, or values the server's collation
    holds equal) all fall in the same page, so none is skipped.
    """
    after: list[Any] | None = None
    total = 0
    while True:
        upto = None if edge is None else edge(after)
        seen, tail = 0, None
        for batch in page(after, upto):
            seen += batch.num_rows
            tail = batch if batch.num_rows else tail
            yield RecordBatchMessage(dataset, batch)
        total += seen
        if edge is not None:
            if upto is None:
                return total
            if not seen:  # the edge's own row must fall in its page: never loop on it
                raise ProtocolViolation(
                    f"a keyset page of {dataset!r} ending at its edge row {upto!r} was empty",
                    hint="the source compares the key columns inconsistently with their "
                    "order; declare a key of plain columns",
                )
            after = upto
            continue
        if seen < page_rows or tail is None:
            return total
        end = tail.num_rows - 1
        after = [tail.column(c)[end].as_py() for c in order]


def final_state(
    request: ReadRequest, checkpoint: Any, to_json: Callable[[Any], Any], *, cursor: bool
) -> StateMessage:
    """The last message of a read: empty, or a cursor read's checkpoint.

    A cursor read that read nothing keeps the previous state (and its
    position); otherwise the state is ``to_json(checkpoint)`` and the
    cursor's trust basis.
    """
    if not cursor:
        return StateMessage(request.dataset, {}, final=True)
    spec = request.cursor
    assert spec is not None
    previous = dict(request.state or {})
    if checkpoint is None:
        last = previous.get("cursor")
        return StateMessage(
            request.dataset, previous, None if last is None else str(last), final=True
        )
    value = to_json(checkpoint)
    return StateMessage(
        request.dataset, {"cursor": value, "trust": spec.trust}, str(value), final=True
    )


__all__ = [
    "Closable",
    "ControlTotals",
    "cursor_order",
    "Named",
    "SQLReadOptions",
    "SessionRead",
    "SettingsSession",
    "Transaction",
    "cast_key",
    "casts_by_relation",
    "check_lookback",
    "close_quietly",
    "final_state",
    "KeysetAtom",
    "keyset_pages",
    "keyset_terms",
    "lower_by",
    "tie_free",
    "null_cursor_error",
    "numeric_lookback",
    "select_plans",
    "sql_read_options",
    "split_qualified",
    "time_window",
    "unreadable_column_fix",
]
