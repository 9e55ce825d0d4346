"""Alerts sent to people: each ``alert.*`` event to each configured target, once.

The Activity feed is the outbox: an alert is written in the transaction of
what raised it, and a sender later claims it for each target (a
``notifications`` row, so two senders never both send it), POSTs it with
retries and exponential backoff (tenacity), and records the outcome as an
Activity event, ``notification.sent`` or ``notification.failed``, with the
attempts it took; never the target's URL or secret. Senders run beside the
work, never in it: a capture hands the sending to a background thread
(:class:`Sender`) and ends at its normal speed whatever the target does;
an alert left unsent by a process that ended is sent by the next sender
(the scheduler, a worker, ``combined alerts``). A sender that is closed
(the engine's end, before its process's) claims nothing more, gives what
it is sending :data:`GRACE_S` to finish, and releases the claim of what it
could not finish, so that the next sender sends it at once, not after
:data:`CLAIM` (its POST may still have reached the target: a receiver
tells a repeat by ``X-Combined-Event``).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from combined.catalog import Catalog
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.config._models import NotificationTarget
from combined.errors import CombinedError, redact
from combined.protocol import utcnow

if TYPE_CHECKING:
    from combined.engine import Engine

log = logging.getLogger(__name__)

#: Alerts older than this when first seen by a target are not sent (a target
#: added to a project with a long history is not flooded with it).
WINDOW = timedelta(days=1)
#: How long a claim holds before another sender may take the alert again.
CLAIM = timedelta(minutes=10)
#: Each HTTP request's time limit, in seconds.
TIMEOUT_S = 10.0
#: How long a closing sender waits for the alert it is sending, in seconds.
GRACE_S = 2.0

#: The claims a sender holds, (target, event id): released if it is closed first.
Held = set[tuple[str, int]]
#: The outcomes of a sender's sends: (target, error), the error None for a delivery.
Told = collections.deque[tuple[str, str | None]]


class Refused(Exception):
    """The target answered with a status a retry may fix (429, 5xx)."""


#: The events that end an alert's condition, sent like alerts to whoever wants
#: the alert they end (``run.recovered`` names it in its body's ``resolves``).
RESOLVES = {
    "freshness.restored": "alert.freshness",
    "cdc.slot_safe": "alert.cdc_slot_at_risk",
    "lake.reachable": "alert.lake_unreachable",
    "run.recovered": None,
}


def resolves(event: Any) -> str | None:
    """The alert kind ``event`` ends, or None when it is an alert itself."""
    if event.kind not in RESOLVES:
        return None
    return RESOLVES[event.kind] or str((event.body or {}).get("resolves", ""))


def pending(conn: sa.Connection, target: str, now: datetime, limit: int = 100) -> list[Any]:
    """Alerts (and their ends) ``target`` has not been sent, nor claimed by a live sender,
    oldest first."""
    a, n = t.activity, t.notifications
    q = (
        sa.select(a)
        .outerjoin(n, sa.and_(n.c.event_id == a.c.id, n.c.target == target))
        .where(
            sa.or_(a.c.kind.startswith("alert.", autoescape=True), a.c.kind.in_(list(RESOLVES))),
            a.c.at >= now - WINDOW,
            sa.or_(
                n.c.event_id.is_(None),
                sa.and_(n.c.state == "sending", n.c.claimed_until < now),
            ),
        )
        .order_by(a.c.id)
        .limit(limit)
    )
    return list(conn.execute(q))


def claim(catalog: Catalog, target: str, event_id: int, now: datetime) -> bool:
    """Take one alert for ``target``: a new row, or one whose sender's claim expired."""
    n = t.notifications
    with catalog.begin() as conn:
        taken = conn.execute(
            n.update()
            .where(
                n.c.target == target,
                n.c.event_id == event_id,
                n.c.state == "sending",
                n.c.claimed_until < now,
            )
            .values(claimed_until=now + CLAIM, updated_at=now)
        )
        if taken.rowcount == 1:
            return True
    try:
        with catalog.begin() as conn:
            conn.execute(
                n.insert().values(
                    target=target,
                    event_id=event_id,
                    state="sending",
                    attempts=0,
                    claimed_until=now + CLAIM,
                    updated_at=now,
                )
            )
    except sa.exc.IntegrityError:
        return False  # another sender claimed it first
    return True


def release(catalog: Catalog, held: Held) -> None:
    """Give up the claims in ``held`` that are still sending: the next sender takes them."""
    n = t.notifications
    now = utcnow()
    with catalog.begin() as conn:
        for target, event_id in list(held):
            conn.execute(
                n.update()
                .where(n.c.target == target, n.c.event_id == event_id, n.c.state == "sending")
                .values(claimed_until=now, updated_at=now)
            )
    held.clear()


def payload(event: Any) -> dict[str, Any]:
    """The JSON an alert is sent as (the Activity event as ``combined activity --json`` has it)."""
    return {
        "id": event.id,
        "kind": event.kind,
        "at": event.at.isoformat(),
        "source": event.source,
        "dataset": event.dataset,
        "run_id": event.run_id,
        "resolves": resolves(event),
        "summary": summary(event),
        "body": event.body,
    }


def summary(event: Any) -> str:
    """One line a person reads: what, where, why."""
    where = ".".join(p for p in (event.source, event.dataset) if p) or "the project"
    body = event.body or {}
    why = body.get("why") or body.get("error") or body.get("reason") or ""
    run = f" (run {event.run_id})" if event.run_id else ""
    ended = resolves(event)
    what = f"resolved {ended}" if ended else event.kind
    return redact(f"Combined {what} on {where}{run}" + (f": {why}" if why else ""))


def request(
    target: NotificationTarget, event: Any, project_root: Path
) -> tuple[str, bytes, dict[str, str]]:
    """The URL, body and headers of one alert's POST to ``target``."""
    url = target.url.resolve(project_root, where=f"notifications.{target.name}.url")
    if target.type == "slack":
        body = json.dumps({"text": summary(event)}).encode()
        return url, body, {"Content-Type": "application/json"}
    body = json.dumps(payload(event), sort_keys=True, default=str).encode()
    assert target.secret is not None, "validated by NotificationTarget"
    key = target.secret.resolve(project_root, where=f"notifications.{target.name}.secret")
    digest = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        target.header: f"sha256={digest}",
        "X-Combined-Event": str(event.id),
    }
    return url, body, headers


def post(
    url: str, body: bytes, headers: dict[str, str], attempts: int, stop: threading.Event
) -> tuple[int, str | None]:
    """POST with retries and exponential backoff; (attempts made, error or None).

    A connection error, a timeout, 429 and 5xx are retried; another status
    is final (a 4xx: the target refuses this request, a retry would not help).
    Once ``stop`` is set, no further attempt is made (nor waited for).
    """
    import httpx
    from tenacity import (
        Retrying,
        retry_if_exception_type,
        stop_after_attempt,
        stop_when_event_set,
        wait_exponential_jitter,
    )

    retrying = Retrying(
        stop=stop_after_attempt(attempts) | stop_when_event_set(stop),
        wait=wait_exponential_jitter(multiplier=0.5, max=30),
        sleep=lambda seconds: _pause(stop, seconds),
        retry=retry_if_exception_type((httpx.TransportError, Refused)),
        reraise=True,
    )
    made = 0
    try:
        for attempt in retrying:
            with attempt:
                made += 1
                response = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT_S)
                if response.status_code == 429 or response.status_code >= 500:
                    raise Refused(f"the target answered HTTP {response.status_code}")
    except (httpx.TransportError, Refused) as exc:
        # The exception's own text only: an httpx error may name the URL, a credential.
        return made, redact(f"{type(exc).__name__}: {exc}")
    if response.status_code >= 300:
        return made, f"the target answered HTTP {response.status_code}"
    return made, None


def _pause(stop: threading.Event, seconds: float) -> None:
    """A backoff between attempts, cut short when the sender is closed."""
    stop.wait(seconds)


def send_one(
    engine: Engine,
    target: NotificationTarget,
    event: Any,
    stop: threading.Event | None = None,
    told: Told | None = None,
) -> bool:
    """Send one claimed alert to ``target`` and record the outcome; whether it was delivered.

    An attempt that failed once ``stop`` was set is no outcome: the claim
    is released for the next sender, which makes every attempt again.
    ``told`` gets each outcome: the target's name and the error (None: sent).
    """
    stop = stop or threading.Event()
    error: str | None
    try:
        url, body, headers = request(target, event, engine.project.root)
    except CombinedError as exc:  # a secret not set: told, and not retried by this sender
        made, error = 0, exc.message
    else:
        made, error = post(url, body, headers, target.attempts, stop)
        if error is not None and stop.is_set():
            release(engine.catalog, {(target.name, event.id)})
            return False
    state = "sent" if error is None else "failed"
    now = utcnow()
    n = t.notifications
    with engine.catalog.begin() as conn:
        conn.execute(
            n.update()
            .where(n.c.target == target.name, n.c.event_id == event.id)
            .values(state=state, attempts=made, error=error, updated_at=now)
        )
        cat.emit(
            conn,
            f"notification.{state}",
            source=event.source,
            dataset=event.dataset,
            run_id=event.run_id,
            target=target.name,
            type=target.type,
            alert=event.kind,
            event=event.id,
            attempts=made,
            error=error,
        )
    if told is not None:
        told.append((target.name, error))
    return error is None


def drain(
    engine: Engine,
    stop: threading.Event | None = None,
    held: Held | None = None,
    told: Told | None = None,
) -> int:
    """Send every pending alert to every target it is meant for; how many were delivered.

    Once ``stop`` is set, nothing more is claimed; ``held`` keeps the
    claims taken and not yet settled (see :class:`Sender`); ``told`` gets
    each send's outcome.
    """
    stop = stop or threading.Event()
    held = set() if held is None else held
    sent = 0
    for target in engine.project.notifications:
        sent += _drain_target(engine, target, stop, held, told)
    return sent


def _drain_target(
    engine: Engine,
    target: NotificationTarget,
    stop: threading.Event,
    held: Held,
    told: Told | None = None,
) -> int:
    sent = 0
    while not stop.is_set():
        now = utcnow()
        with engine.catalog.begin() as conn:
            events = pending(conn, target.name, now)
        if not events:
            return sent
        for event in events:
            if stop.is_set() or not claim(engine.catalog, target.name, event.id, now):
                continue
            held.add((target.name, event.id))
            if not target.wants(resolves(event) or event.kind, event.source, event.dataset):
                _skip(engine.catalog, target.name, event.id)
            else:
                sent += send_one(engine, target, event, stop, told)
            held.discard((target.name, event.id))
    return sent


def _skip(catalog: Catalog, target: str, event_id: int) -> None:
    n = t.notifications
    with catalog.begin() as conn:
        conn.execute(
            n.update()
            .where(n.c.target == target, n.c.event_id == event_id)
            .values(state="skipped", updated_at=utcnow())
        )


class Sender:
    """Sends pending alerts from a background thread, one drain at a time.

    :meth:`soon` returns at once: a drain already running drains again when
    it ends, so an alert raised meanwhile is not left behind. The thread is
    a daemon, which the interpreter's exit stops wherever it is: the engine's
    :meth:`close` (before its process ends) releases what it had claimed.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._again = False
        self._stop = threading.Event()
        self._held: Held = set()
        #: The latest sends' outcomes in this process (what `combined alerts` reports).
        self.told: Told = collections.deque(maxlen=10_000)

    def soon(self) -> None:
        """Drain in the background (nothing when no target is configured, or once closed)."""
        if not self.engine.project.notifications:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is not None and self._thread.is_alive():
                self._again = True
                return
            self._again = False
            self._thread = threading.Thread(target=self._run, name="combined-notify", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the running drain (tests, and a command that must send before it exits)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def close(self, grace: float = GRACE_S) -> None:
        """Let the running drain send for up to ``grace`` seconds, then claim nothing more;
        wait for the request in flight (at most its time limit), then release the claims left.

        A command that raised an alert (``schedule --once`` from cron) used to
        stop its drain before it claimed anything: the alert was never sent.
        A request still in flight had its claim released and the process
        ended before recording the answer: the next command sent it again,
        each minute. Without the release, an alert claimed by a process that
        ended before sending it waited out its claim (:data:`CLAIM`).
        """
        self.wait(grace)
        with self._lock:
            self._stop.set()
        self.wait(TIMEOUT_S + 1.0)  # (a request in flight, most often, ends within it)
        thread = self._thread
        if thread is not None and thread.is_alive():
            # Still waiting on a target that drips its answer: its claim is left to
            # expire (CLAIM) rather than released, which would send the alert again.
            return
        if self._held:
            release(self.engine.catalog, self._held)

    def _run(self) -> None:
        while True:
            try:
                drain(self.engine, self._stop, self._held, self.told)
            except Exception as exc:  # noqa: BLE001 - the next drain retries; the work goes on
                log.warning("sending alerts failed, the next sender retries: %s", redact(repr(exc)))
            with self._lock:
                if not self._again:
                    return
                self._again = False
