"""The http source: check, discover and read the endpoints of a REST/JSON API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from combined.connectors.abc import (
    BaseSource,
    CursorCandidate,
    DatasetDiscovery,
    Discovery,
    Extraction,
    FieldInfo,
    KeyCandidate,
    ReadRequest,
    Strategy,
    refuse_bounds,
    require_cursor_and_key,
)
from combined.connectors.http._client import Session, scrubber
from combined.connectors.http._extraction import HTTPExtraction, order_key
from combined.connectors.http._pages import pages
from combined.connectors.http._records import infer, plan
from combined.connectors.http._settings import SOURCE_KEYS, Endpoint, Settings
from combined.errors import ConfigError

_PUBLIC_FIX = (
    "give the secret under `auth` (type bearer, basic, or api_key with `in: header` or "
    '`in: query`), e.g. auth: {type: api_key, in: query, name: key, api_key: {secret: "env:KEY"}}'
)
_PUBLIC_WHY = (
    "it is shown in errors, discovery and the catalog (URLs, headers, parameters), and only "
    "`auth` is kept out of them"
)


class HTTPSource(BaseSource):
    """A REST/JSON API read over HTTP(S), endpoint by endpoint.

    Configuration:

    ``base_url``
        The API's root (``https://api.example.com/v1``). Every request, every
        redirect followed and every next-page link stays on its origin
        (scheme, host and port), or on one listed in ``credential_hosts``.
    ``auth`` (optional)
        ``{type: bearer, token: ...}``, ``{type: basic, username, password}``
        or ``{type: api_key, name: X-Api-Key, in: header | query, api_key:
        ...}``, each secret a reference. The only place a secret may go.
    ``headers``, ``timeout`` (s, 30), ``rate_limit`` (requests/s), ``max_pages``
    (10000), ``max_retry_wait`` (s, 60), ``max_response_bytes`` (64 MiB), ``check_path``,
    ``credential_hosts`` (origins besides base_url's the credentials may go to)
        Request settings and guards.
    ``endpoints``
        Named endpoints: ``{orders: {path: /orders, params: {...}, records:
        data.items, paginate: {style: cursor, param: page_token, next:
        meta.next}, fields: {id: integer, updated_at: timestamp}, allow_empty:
        false, since: {param: updated_since, format: iso}}}``; ``paginate``
        also takes ``expired`` (the API's expired-token answer, 410 by
        default) and ``restarts``. A dataset's ``relation`` names one (it
        defaults to the dataset's name).

    Strategies: ``snapshot`` (every page, reduced against the lake by key)
    and ``cursor`` (the checkpoint passed in ``since``); see ``docs/http.md``.
    """

    name: ClassVar[str] = "http"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = True
    SUPPORTS_CDC: ClassVar[bool] = False
    CURSOR_NEEDS_KEY: ClassVar[bool] = True
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool] = False
    #: An API's ``since`` filter is often inclusive, and a lookback re-reads a window.
    REDELIVERS: ClassVar[bool] = True
    #: Discovery reads each endpoint's first page: not worth its requests before a capture.
    DISCOVERY_READS_RECORDS: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = SOURCE_KEYS
    PUBLIC_KEYS: ClassVar[Mapping[str, tuple[str, str]]] = {
        key: (f"`{key}` {_PUBLIC_WHY}", _PUBLIC_FIX)
        for key in ("base_url", "headers", "endpoints", "check_path", "credential_hosts")
    }

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings = Settings.parse(self.config)
        self._scrub = scrubber(self.settings)

    def _session(self) -> Session:
        return Session(self.settings, self._scrub)

    def check(self) -> None:
        """One request: ``check_path``, else the first endpoint's first page."""
        session = self._session()
        try:
            if self.settings.check_path is not None:
                session.get(session.url(self.settings.check_path))
                return
            first = next(iter(self.settings.endpoints.values()), None)
            if first is None:
                session.get(session.url("/"))
                return
            next(pages(session, first, first.params, 1), None)
        finally:
            session.close()

    def discover(self) -> Discovery:
        """Each declared endpoint from its first page: fields, key and cursor candidates."""
        session = self._session()
        try:
            datasets = tuple(self._describe(session, e) for e in self.settings.endpoints.values())
        finally:
            session.close()
        return Discovery(connector=self.name, revision=self.revision, datasets=datasets)

    def _describe(self, session: Session, endpoint: Endpoint) -> DatasetDiscovery:
        page = next(pages(session, endpoint, endpoint.params, 1))
        rows = [r for r in page.records if isinstance(r, dict)]
        declared = dict(endpoint.fields)
        names: dict[str, None] = dict.fromkeys(declared)
        for r in rows:
            names.update(dict.fromkeys(r))
        fields = []
        keys = []
        cursors = []
        n = len(rows)
        for name in names:
            values = [r.get(name) for r in rows]
            kind = declared.get(name) or infer(values)
            if kind is None:
                fields.append(FieldInfo(name, "null", "null in every sampled record (no type yet)"))
                continue
            source = kind if name in declared else f"{kind} (inferred)"
            fields.append(FieldInfo(name, str(plan(name, kind).arrow), source))
            present = [v for v in values if v is not None]
            if _may_be_key(present, n):
                keys.append(
                    KeyCandidate(
                        (name,),
                        f"unique and never null in the {n} records of the first page; the API "
                        "enforces no key we can see, so declare it only if its documentation does",
                    )
                )
            what = _ordered(present, n)
            if what is not None:
                cursors.append(
                    CursorCandidate(
                        name,
                        f"{what} in order across the {n} records of the first page: weak "
                        "evidence; the API must filter by it (since) and say in its "
                        "documentation that it only grows, as cursor.trust records",
                    )
                )
        strategies: tuple[Strategy, ...] = (
            ("snapshot", "cursor") if endpoint.since is not None else ("snapshot",)
        )
        notes = [f"first page: {len(page.records)} records from {session.shown(page.url)}"]
        notes += _paging_notes(endpoint)
        return DatasetDiscovery(
            name=endpoint.name,
            relation=endpoint.name,
            kind=f"http endpoint {endpoint.path}",
            fields=tuple(fields),
            cursor_candidates=tuple(cursors),
            key_candidates=tuple(keys),
            strategies=strategies,
            notes=tuple(notes),
        )

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a read of one endpoint; nothing is requested until it is iterated."""
        if request.strategy not in ("snapshot", "cursor"):
            raise ConfigError(
                f"the http connector cannot read with strategy {request.strategy!r}",
                hint="use strategy: snapshot or cursor",
                dataset=request.dataset,
            )
        refuse_bounds(self.name, request, "drop the bounds: an endpoint is read whole")
        if request.batch_rows < 1:
            raise ConfigError("batch_rows must be positive", hint="e.g. 65536")
        endpoint = self.settings.endpoint(request.relation)
        if request.strategy == "cursor":
            require_cursor_and_key(request)
            if endpoint.since is None:
                raise ConfigError(
                    f"dataset {request.dataset!r} reads endpoint {endpoint.name!r} by cursor, "
                    "but the endpoint declares no `since` parameter to pass the checkpoint in",
                    hint=f"add since: {{param: <the API's filter, e.g. updated_since>, format: "
                    f"raw | iso}} under config.endpoints.{endpoint.name}, or use strategy: "
                    "snapshot",
                    dataset=request.dataset,
                )
        return HTTPExtraction(
            settings=self.settings, scrub=self._scrub, endpoint=endpoint, request=request
        )


def _may_be_key(present: list[Any], n: int) -> bool:
    """Whether a field's sampled values (``n`` records) are scalars, never null and unique."""
    scalar = all(isinstance(v, int | str) and not isinstance(v, bool) for v in present)
    return bool(n) and scalar and len(present) == n and len({str(v) for v in present}) == n


def _ordered(present: list[Any], n: int) -> str | None:
    """``times`` or ``numbers`` when a field's ``n`` sampled values are all such and in order."""
    order = [order_key(v) for v in present]
    if n < 2 or len(present) != n or not all(o is not None for o in order):
        return None
    kinds = {o[0] for o in order if o is not None}
    seq = [o[1] for o in order if o is not None]
    if len(kinds) == 1 and (seq == sorted(seq) or seq == sorted(seq, reverse=True)):
        return "times" if kinds == {"time"} else "numbers"
    return None


def _paging_notes(endpoint: Endpoint) -> list[str]:
    """What discovery tells of the endpoint's cursor reads and paging."""
    notes = []
    if endpoint.since is None:
        notes.append("no `since` parameter is declared, so a cursor read is not possible")
    if endpoint.paginate.style in ("page", "offset"):
        notes.append(
            f"{endpoint.paginate.style} paging over changing data can skip or repeat "
            "records; cursor or link paging is safer where the API offers it"
        )
    return notes


__all__ = ["HTTPSource"]
