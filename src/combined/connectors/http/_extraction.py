"""One read of an endpoint: every page, as bounded Arrow batches, then one final state.

An API offers no snapshot: pages are read one after another while the
data may change. The receipt says so: its snapshot authority is
``http:pages``, and its source token the digest of the bodies read, which
proves what was read, not that it was consistent. A snapshot read of no
record at all is refused unless the endpoint says ``allow_empty: true``:
committed, it would delete every row of the dataset.

A cursor read passes its checkpoint (less the lookback) in the endpoint's
``since`` parameter; the next checkpoint is the largest cursor value among
the records read, never below the previous one, handed over in the read's
only state message, after every record: the engine commits it with them.

A page token the API expired mid-read starts the pages over from the read's
start, handing over only keys not handed over yet (see ``_restart``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from combined.connectors._shared import numeric_lookback, time_window
from combined.connectors._subprocess._rows import described
from combined.connectors.abc import BaseExtraction, CursorSpec, ReadRequest
from combined.connectors.http._client import PageExpired, Session
from combined.connectors.http._pages import Page, pages
from combined.connectors.http._records import Records
from combined.connectors.http._restart import Delivered
from combined.connectors.http._settings import Endpoint, Settings
from combined.connectors.sqlite._cursor import shift_iso_text
from combined.errors import ConfigError, ProtocolViolation, SchemaMismatch, SourceError
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome, utcnow

#: The snapshot authority receipts name: pages read in turn, with no isolation.
PAGES_AUTHORITY = "http:pages"


def instant(text: str) -> datetime | None:
    """An ISO-8601 text as an aware instant (a naive one read as UTC); None if not one."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def order_key(value: Any) -> tuple[str, Any] | None:
    """How cursor values compare: numbers as numbers, ISO-8601 texts as instants."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal | float):
        return ("number", Decimal(str(value)))
    if isinstance(value, str):
        when = instant(value)
        return None if when is None else ("time", when)
    return None


def cursor_state(value: Any) -> Any:
    """A cursor value as the checkpoint keeps it: a fractional ``Decimal`` as its digits,
    tagged (``{"decimal": "0.99999999999999999"}``; JSON's float rounded it, and the
    next read asked for rows past ones it never read)."""
    if isinstance(value, Decimal):
        if value == value.to_integral_value():
            return int(value)
        return {"decimal": str(value)}
    return value


def cursor_value(kept: Any) -> Any:
    """:func:`cursor_state`'s value back (a ``Decimal`` for the tagged digits)."""
    if isinstance(kept, Mapping) and isinstance(kept.get("decimal"), str):
        return Decimal(kept["decimal"])
    return kept


def since_value(spec: CursorSpec, last: Any, fmt: str) -> str:
    """The text of the ``since`` parameter: the checkpoint less the lookback, as ``fmt`` says."""
    lookback = spec.lookback
    bound: Any = last
    if isinstance(last, int | float | Decimal) and not isinstance(last, bool):
        if fmt == "iso":
            raise ConfigError(
                f"cursor {spec.column!r} holds numbers, which since.format iso cannot write",
                hint="use since.format: raw to pass the number as it is",
            )
        if lookback:
            from combined.connectors._shared import lower_by

            bound = lower_by(last, numeric_lookback(spec.column, lookback))
        return str(bound)
    text = str(last)
    window = time_window(lookback) if lookback else None
    if fmt == "iso":
        when = instant(text)
        if when is None:
            raise SchemaMismatch(
                f"the checkpoint ({described(text)}) of cursor {spec.column!r} is not an "
                "ISO-8601 time",
                hint="reset the dataset's checkpoint, or use since.format: raw",
            )
        if window:
            when -= window
        return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return shift_iso_text(text, window, spec.column) if window else text


class HTTPExtraction(BaseExtraction):
    """A snapshot or cursor read of one endpoint, every page in turn.

    Iterating twice, or after :meth:`finish`, is a
    :class:`~combined.errors.ProtocolViolation`; :meth:`finish` (from any
    thread) closes the connections.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        scrub: Callable[[str], str],
        endpoint: Endpoint,
        request: ReadRequest,
    ) -> None:
        super().__init__()
        self._settings = settings
        self._scrub = scrub
        self._endpoint = endpoint
        self._request = request
        self._session: Session | None = None
        #: The largest cursor value handed over (its order key and value), and the count.
        self._top: tuple[tuple[str, Any], Any] | None = None
        self._total = 0
        self._guard = threading.Lock()
        self._started = False
        self._finished = False

    def _claim(self) -> Session:
        with self._guard:
            if self._finished:
                raise ProtocolViolation("the extraction is finished", hint="start a new read")
            if self._started:
                raise ProtocolViolation(
                    "the extraction was already read", hint="start a new read for another pass"
                )
            self._started = True
            self._session = Session(self._settings, self._scrub)
            return self._session

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._guard:
            self._finished = True
            session, self._session = self._session, None
        if session is not None:
            session.close()
        return ()

    def _live(self) -> None:
        if self._finished:
            raise ProtocolViolation("the extraction is finished", hint="start a new read")

    def _params(self) -> dict[str, str]:
        params = dict(self._endpoint.params)
        request = self._request
        if request.strategy != "cursor":
            return params
        assert request.cursor is not None and self._endpoint.since is not None
        last = cursor_value((request.state or {}).get("cursor"))
        if last is not None:
            since = self._endpoint.since
            params[since.param] = since_value(request.cursor, last, since.format)
        return params

    def _messages(self) -> Iterator[Message]:
        session = self._claim()
        request, endpoint = self._request, self._endpoint
        state = dict(request.state or {})
        known = state.get("fields") if isinstance(state.get("fields"), dict) else {}
        selected = None
        if request.columns is not None:
            selected = [*request.columns, *request.key]
            if request.cursor is not None:
                selected.append(request.cursor.column)
        where = f"config.endpoints.{endpoint.name}" if endpoint.declared else "an endpoint"
        records = Records(
            endpoint.name, endpoint.fields, known or {}, selected, where, self._settings.json_keys
        )
        delivered = Delivered(request.key, endpoint)
        digests: list[str] = []
        self.authority.acquire()
        started = utcnow()
        try:
            params = self._params()
            limit = self._settings.max_pages_of(endpoint)
            while True:
                number = 0  # the last page read in this pass
                try:
                    for page in pages(session, endpoint, params, limit):
                        number = page.number
                        digests.append(page.digest)
                        yield from self._take(page, records, delivered)
                        self._live()
                    break
                except PageExpired as exc:
                    # Start over from where the read started (the committed checkpoint).
                    delivered.restart(endpoint, exc, number + 1)
            if len(records):
                yield self._batch(records)
        finally:
            delivered.close()
            self._release_session()
        if self._total == 0 and request.strategy == "snapshot" and not endpoint.allow_empty:
            raise SourceError(
                f"endpoint {endpoint.name!r} answered no record: an empty snapshot would delete "
                f"every row of dataset {request.dataset!r}, so nothing was read",
                hint="check the endpoint's path, params and `records`; if no record is a real "
                f"state of it, set `allow_empty: true` under {where}",
                endpoint=endpoint.name,
            )
        token = json.dumps(digests, separators=(",", ":"))
        self.authority.acquire_snapshot(PAGES_AUTHORITY, token, at=started)
        self.authority.complete()
        # A record that changed across a restart kept its first version: the
        # checkpoint stays where it was, so that the next read asks for it again.
        yield self._final(state, records, None if delivered.changed else self._top)

    def _take(
        self, page: Page, records: Records, delivered: Delivered
    ) -> Iterator[RecordBatchMessage]:
        """Hand over the page's records (those not handed over before a restart)."""
        endpoint, request = self._endpoint, self._request
        cursor = request.cursor if request.strategy == "cursor" else None
        for index, record in enumerate(page.records):
            if not isinstance(record, dict):
                raise SchemaMismatch(
                    f"endpoint {endpoint.name!r}: record {index + 1} of page "
                    f"{page.number} is a JSON {type(record).__name__}, not an object",
                    hint="point `records` at the list of record objects; nothing was committed",
                    endpoint=endpoint.name,
                    page=page.number,
                )
            if not delivered.admit(record):
                continue
            if cursor is not None:
                value = record.get(cursor.column)
                if value is None:
                    if cursor.nulls == "exclude":
                        continue
                    if cursor.nulls == "fail":
                        raise self._null_cursor(cursor, page.number)
                else:
                    key = self._order(cursor, value, page.number)
                    if self._top is None or self._above(cursor, key, self._top[0]):
                        self._top = (key, value)
            records.add(record, page.number)
            self._total += 1
            if len(records) >= request.batch_rows:
                yield self._batch(records)

    def _release_session(self) -> None:
        with self._guard:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def _batch(self, records: Records) -> RecordBatchMessage:
        batch = records.take()
        self.authority.count(batch.num_rows, batch.nbytes)
        return RecordBatchMessage(self._request.dataset, batch)

    def _null_cursor(self, cursor: CursorSpec, page: int) -> SchemaMismatch:
        return SchemaMismatch(
            f"endpoint {self._endpoint.name!r}: a record on page {page} holds no value of "
            f"cursor {cursor.column!r}, which no checkpoint reaches: nothing was committed",
            hint="set cursor.nulls: include to keep such records (read whenever the API returns "
            "them), or cursor.nulls: exclude to leave them out",
            endpoint=self._endpoint.name,
            column=cursor.column,
        )

    def _order(self, cursor: CursorSpec, value: Any, page: int) -> tuple[str, Any]:
        key = order_key(value)
        if key is None:
            raise SchemaMismatch(
                f"endpoint {self._endpoint.name!r}: cursor {cursor.column!r} holds "
                f"{described(value)} on page {page}, which is neither a number nor an "
                "ISO-8601 time",
                hint="choose a cursor field that holds numbers or RFC 3339 times; nothing was "
                "committed",
                endpoint=self._endpoint.name,
                column=cursor.column,
            )
        return key

    def _above(self, cursor: CursorSpec, key: tuple[str, Any], other: tuple[str, Any]) -> bool:
        if key[0] != other[0]:
            raise SchemaMismatch(
                f"endpoint {self._endpoint.name!r}: cursor {cursor.column!r} holds both numbers "
                "and times, which do not compare",
                hint="choose a cursor field of one kind; nothing was committed",
                endpoint=self._endpoint.name,
                column=cursor.column,
            )
        return bool(key[1] > other[1])

    def _final(
        self, state: dict[str, Any], records: Records, top: tuple[tuple[str, Any], Any] | None
    ) -> StateMessage:
        request = self._request
        fields = records.remembered()
        if request.strategy != "cursor":
            return StateMessage(request.dataset, {"fields": fields} if fields else {}, final=True)
        assert request.cursor is not None
        last = cursor_value(state.get("cursor"))
        if top is None:
            # Nothing read: the checkpoint stays where it was.
            return StateMessage(
                request.dataset, state, None if last is None else str(last), final=True
            )
        value = top[1]
        if last is not None:
            before = order_key(last)
            # Never backwards: the newest records may be gone since the last read.
            if before is not None and before[0] == top[0][0] and before[1] > top[0][1]:
                value = last
        new = {"cursor": cursor_state(value), "trust": request.cursor.trust, "fields": fields}
        return StateMessage(request.dataset, new, str(value), final=True)


__all__ = ["PAGES_AUTHORITY", "HTTPExtraction", "instant", "order_key", "since_value"]
