"""``GET /metrics``: Prometheus metrics computed from the catalog on each scrape.

Nothing is counted in this process's memory: every value is read from the
catalog the scrape asks, so any API process reports the same numbers,
whichever worker or CLI did the work. The endpoint asks no source: a CDC
stream's lag is its newest kept status (``cdc.slot_status``, kept when a
capture or ``combined alerts`` checks the stream).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from combined.catalog import _schema as t

if TYPE_CHECKING:
    from combined.engine import Engine

#: Upper bounds (seconds) of the duration histograms' buckets.
BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, float("inf"))


def histogram(name: str, doc: str, seconds: Iterable[float]) -> HistogramMetricFamily:
    """A Prometheus histogram of ``seconds`` over :data:`BUCKETS`."""
    values = sorted(seconds)
    counts, i = [], 0
    for bound in BUCKETS:
        while i < len(values) and values[i] <= bound:
            i += 1
        counts.append((_bound(bound), float(i)))
    return HistogramMetricFamily(name, doc, buckets=counts, sum_value=sum(values))


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


def _span(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else max((end - start).total_seconds(), 0.0)


class CatalogCollector(Collector):
    """Collects every metric from one engine's catalog (and project, for freshness)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        """Each metric family, read now."""
        with self.engine.catalog.begin() as conn:
            yield from self._runs(conn)
            yield from self._deliveries(conn)
            yield from self._quarantine(conn)
            yield from self._usage(conn)
            yield from self._slots(conn)
        yield from self._freshness()

    def _runs(self, conn: sa.Connection) -> Iterator[Metric]:
        r = t.runs
        states = GaugeMetricFamily("combined_runs", "Runs by state", labels=["source", "state"])
        q = sa.select(r.c.source, r.c.state, sa.func.count()).group_by(r.c.source, r.c.state)
        for source, state, count in conn.execute(q):
            states.add_metric([source, state], count)
        yield states
        ended = list(conn.execute(sa.select(r.c.started_at, r.c.ended_at)))
        yield histogram(
            "combined_capture_duration_seconds",
            "How long Runs took, from their first read to their end",
            [s for a, b in ended if (s := _span(a, b)) is not None],
        )
        a = t.activity
        committing = (
            sa.select(a.c.run_id, sa.func.max(a.c.at).label("at"))
            .where(a.c.kind == "run.committing")
            .group_by(a.c.run_id)
            .subquery()
        )
        q = sa.select(committing.c.at, r.c.ended_at).join(r, r.c.id == committing.c.run_id)
        yield histogram(
            "combined_commit_duration_seconds",
            "How long Runs took from their first lake commit to their end (publication)",
            [s for a, b in conn.execute(q) if (s := _span(a, b)) is not None],
        )

    def _deliveries(self, conn: sa.Connection) -> Iterator[Metric]:
        d = t.deliveries
        labels = ["source", "dataset"]
        rows = CounterMetricFamily("combined_rows_captured", "Rows committed", labels=labels)
        size = CounterMetricFamily("combined_bytes_captured", "Bytes committed", labels=labels)
        count = CounterMetricFamily(
            "combined_deliveries", "Deliveries by state", labels=[*labels, "state"]
        )
        q = sa.select(
            d.c.source,
            d.c.dataset,
            d.c.state,
            sa.func.count(),
            sa.func.sum(d.c.record_count),
            sa.func.sum(d.c.byte_count),
        ).group_by(d.c.source, d.c.dataset, d.c.state)
        for source, dataset, state, n, records, nbytes in conn.execute(q):
            count.add_metric([source, dataset, state], n)
            if state == "committed":
                rows.add_metric([source, dataset], int(records or 0))
                size.add_metric([source, dataset], int(nbytes or 0))
        yield from (rows, size, count)

    def _quarantine(self, conn: sa.Connection) -> Iterator[Metric]:
        q_ = t.quarantine
        labels = ["source", "dataset"]
        entries = GaugeMetricFamily(
            "combined_quarantine_entries", "Quarantine entries awaiting review", labels=labels
        )
        records = GaugeMetricFamily(
            "combined_quarantine_records", "Records in entries awaiting review", labels=labels
        )
        q = (
            sa.select(q_.c.source, q_.c.dataset, sa.func.count(), sa.func.sum(q_.c.record_count))
            .where(q_.c.decision.is_(None))
            .group_by(q_.c.source, q_.c.dataset)
        )
        for source, dataset, n, total in conn.execute(q):
            entries.add_metric([source, dataset], n)
            records.add_metric([source, dataset], int(total or 0))
        yield from (entries, records)

    def _usage(self, conn: sa.Connection) -> Iterator[Metric]:
        u = t.usage
        mar = GaugeMetricFamily(
            "combined_mar", "Monthly active rows", labels=["source", "dataset", "month"]
        )
        for row in conn.execute(sa.select(u.c.source, u.c.dataset, u.c.month, u.c.mar)):
            mar.add_metric([row.source, row.dataset, row.month], row.mar)
        yield mar

    def _slots(self, conn: sa.Connection) -> Iterator[Metric]:
        labels = ["source", "dataset"]
        lag = GaugeMetricFamily(
            "combined_cdc_slot_lag_bytes", "WAL a CDC slot retains not yet captured", labels=labels
        )
        keeps = GaugeMetricFamily(
            "combined_cdc_slot_keeps_seconds",
            "How long the source keeps a slot's WAL at the current rate",
            labels=labels,
        )
        seen = GaugeMetricFamily(
            "combined_cdc_slot_observed_timestamp_seconds",
            "When the stream's status was last read",
            labels=labels,
        )
        for event in _newest(conn, "cdc.slot_status"):
            body: dict[str, Any] = event.body or {}
            key = [event.source, event.dataset]
            seen.add_metric(key, event.at.timestamp())
            if body.get("lag_bytes") is not None:
                lag.add_metric(key, body["lag_bytes"])
            if body.get("keeps_for_seconds") is not None:
                keeps.add_metric(key, body["keeps_for_seconds"])
        yield from (lag, keeps, seen)

    def _freshness(self) -> Iterator[Metric]:
        from combined._freshness import dataset_status

        lag = GaugeMetricFamily(
            "combined_freshness_lag_seconds",
            "Age of each dataset's newest published source position",
            labels=["source", "dataset"],
        )
        target = GaugeMetricFamily(
            "combined_freshness_target_seconds",
            "Each dataset's declared freshness target",
            labels=["source", "dataset"],
        )
        for row in dataset_status(self.engine.catalog, self.engine.project):
            key = list(row["dataset"].split(".", 1))
            if row["age"] is not None:
                lag.add_metric(key, row["age"].total_seconds())
            if row["target"] is not None:
                target.add_metric(key, row["target"].total_seconds())
        yield from (lag, target)


def _newest(conn: sa.Connection, kind: str) -> list[Any]:
    """The newest event of ``kind`` of each dataset."""
    a = t.activity
    newest = (
        sa.select(sa.func.max(a.c.id).label("id"))
        .where(a.c.kind == kind)
        .group_by(a.c.source, a.c.dataset)
        .subquery()
    )
    return list(conn.execute(sa.select(a).join(newest, newest.c.id == a.c.id)))


def metrics_body(engine: Engine) -> tuple[bytes, str]:
    """The exposition text of every metric, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogCollector(engine))
    return generate_latest(registry), CONTENT_TYPE_LATEST
