"""Starting an endpoint's pages over after its page token expired, without handing a key twice.

Cursor and link paging hold the read's position in a token the API may
expire before the read ends (a 410, or an error the endpoint declares in
``paginate.expired``). The records already handed over cannot be taken back,
so the read starts its pages over from where it started (the committed
checkpoint, for a cursor read) and hands over only the keys it has not
handed over yet. :class:`Delivered` remembers each key handed over (a digest
of it, with a digest of its record) from the first page on, as a restart
may come at any page: about a hundred bytes a record.

A record read again with other values than the version handed over changed
meanwhile: its first version stays in this capture, and
:attr:`Delivered.changed` keeps a cursor read's checkpoint where it was, so
the next read asks for it again. (A snapshot brings the change at its next
capture.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from combined.connectors._subprocess._schema import json_encoder
from combined.connectors.http._settings import Endpoint
from combined.errors import SourceUnavailable

#: A value's JSON text with sorted keys: equal for equal records, whatever their keys' order.
canonical = json_encoder(sort_keys=True)


def _digest(value: Any, size: int) -> bytes:
    return hashlib.blake2b(canonical(value).encode(), digest_size=size).digest()


class Delivered:
    """The keys one read handed over, for the pages a restart reads again."""

    def __init__(self, key: Sequence[str], endpoint: Endpoint) -> None:
        self.key = tuple(key)
        #: Keys are remembered only when a restart may come: cursor or link paging
        #: that may start over, and a key to tell the records read twice.
        self.tracking = (
            bool(self.key)
            and endpoint.paginate.restarts > 0
            and endpoint.paginate.style in ("cursor", "link")
        )
        self.restarts = 0
        #: Whether a record read again after a restart differed from the one handed over.
        self.changed = False
        self._seen: dict[bytes, bytes] = {}

    def admit(self, record: Mapping[str, Any]) -> bool:
        """Whether to hand ``record`` over: before any restart always, after one once a key."""
        if not self.tracking:
            return True
        key = _digest([record.get(k) for k in self.key], 16)
        body = _digest(record, 8)
        before = self._seen.setdefault(key, body)
        if not self.restarts or before is body:
            return True  # (a key repeated within one pass is the engine's to refuse)
        if before != body:
            self.changed = True
        return False

    def restart(self, endpoint: Endpoint, expired: SourceUnavailable, page: int) -> None:
        """Count a restart after ``expired`` on ``page``; raise once none is left."""
        paging = endpoint.paginate
        if not self.key or self.restarts >= paging.restarts:
            tried = f", after starting over {self.restarts} times" if self.restarts else ""
            why = (
                "the dataset declares no key to tell the records read twice"
                if not self.key
                else f"paginate.restarts is {paging.restarts}"
            )
            raise SourceUnavailable(
                f"endpoint {endpoint.name!r}: the page token of page {page} expired before "
                f"the read ended{tried} ({expired.message}): nothing was committed",
                hint=f"the read is retried; the API's tokens expire sooner than a read "
                f"takes: ask for larger pages, lower other load on the API, or raise "
                f"config.endpoints.{endpoint.name}.paginate.restarts ({why})",
                endpoint=endpoint.name,
                page=page,
            ) from expired
        self.restarts += 1


__all__ = ["Delivered", "canonical"]
