"""The one error tree of Combined.

Every error the engine raises derives from :class:`CombinedError`::

    CombinedError
     +-- ConfigError                 the project file is invalid (terminal)
     |    +-- SecretError            a secret reference cannot be resolved
     +-- NotFoundError               unknown source, dataset, run or publication
     +-- CatalogError                the control plane is unusable or behind
     +-- SourceError                 the provider failed
     |    +-- SourceUnavailable      cannot reach the source (transient: retried as Attempts)
     |         +-- RetryLater        the source asked to wait past the ceiling: a later Run retries
     |    +-- AuthRejected           credentials refused (Run -> needs_auth, no retry)
     |    +-- NeedsSnapshot          only a new snapshot mends the change stream (needs_review)
     |    |    +-- SlotLost          a PostgreSQL replication slot missing or without its WAL
     |    |    +-- StreamGap         changes left out of the stream: held in the checkpoint
     |    |    +-- BinlogGone        a MariaDB binlog position purged or another log's
     |    +-- SchemaMismatch         a record does not fit the declared schema (needs_review)
     |    +-- UnsupportedType        a source type has no faithful Arrow mapping
     +-- CaptureError                the capture cannot be committed as it is
     |    +-- DuplicateKeys          a snapshot holds a key twice (needs_review)
     |    +-- DriftRejected          schema drift whose policy is `fail` (needs_review)
     |    |    +-- DriftQuarantined   ... is `quarantine`: the capture held in quarantine
     |    +-- StagingLimitExceeded   a run-scoped staging limit was breached
     |    +-- ReconciliationFailed   landed counts disagree with the source (needs_review)
     +-- ProtocolViolation           sequence contiguity, checkpoint barrier, illegal state move
     |    +-- DeliveryAltered        a staged Delivery differs from its record (needs_review)
     +-- LakeError                   the lake refused a write
     |    +-- LakeNotWritable        the lake location cannot be written
 |    |    +-- LakeUnreachable    ... its store did not answer (transient: a worker waits)
     |    +-- TableMissing           a table the catalog records left the lake (needs_review)
     |         +-- TableBehind       ... or is back at an older version (a restored copy)
     +-- CommitAmbiguous             a lake commit may or may not have landed (transient)
     +-- RunCanceled                 a person canceled the Run (Run -> canceled)

Whether an error is retried is decided from its type alone: ``transient`` is a
class constant, and so is ``run_state``, the Run state it leads to.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

# ``redact`` is re-exported: errors and logs everywhere redact through it.
from combined._credentials import redact as redact
from combined._credentials import redact_data

FailureState = Literal["failed", "needs_auth", "needs_review", "canceled"]


class CombinedError(Exception):
    """Root of every error raised by Combined.

    ``hint`` says what to do about it. The message, the hint and the context
    are redacted of credentials when the error is built (text through
    :func:`redact`, values under credential-like keys, at any depth, masked),
    so an error can be logged, pickled and stored as it is.
    """

    transient: ClassVar[bool] = False
    run_state: ClassVar[FailureState] = "failed"

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        message = redact(message)
        self.hint = redact(hint) if hint else None
        self.context = {k: redact_data(v, key=k) for k, v in context.items()}
        super().__init__(message)

    @property
    def message(self) -> str:
        """The short statement of what happened."""
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.hint, self.context))

    def describe(self) -> str:
        """The message followed by the hint, as shown to a person."""
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


def _rebuild(
    cls: type[CombinedError], message: str, hint: str | None, context: dict[str, Any]
) -> CombinedError:
    return cls(message, hint=hint, **context)


class ConfigError(CombinedError):
    """The project file is invalid."""


class SecretError(ConfigError):
    """A secret reference cannot be resolved; names the reference, never a value.

    Inside a Run it is a credential the operator must provide (a variable
    unset or empty, a file missing): the Run ends ``needs_auth``, not retried.
    """

    run_state: ClassVar[FailureState] = "needs_auth"


class NotFoundError(CombinedError):
    """An unknown source, dataset, run or publication was named."""


class FilesExpired(NotFoundError):
    """A publication reads files the lake no longer holds: a retention (or VACUUM) removed them."""


class CatalogError(CombinedError):
    """The catalog cannot be used."""


class SourceError(CombinedError):
    """The provider system failed."""


class SourceUnavailable(SourceError):
    """The source cannot be reached now; retried as another Attempt."""

    transient = True


class RetryLater(SourceUnavailable):
    """The source asked (``Retry-After``) to wait longer than its ceiling allows.

    The Attempt ends at once rather than waiting or asking again; the Run
    fails and a retry is queued that no worker takes before ``not_before``
    (seconds from now: the ``retry_after_s`` in its context).
    """


class AuthRejected(SourceError):
    """The source refused the credentials: a person must act."""

    run_state = "needs_auth"


class NeedsSnapshot(SourceError):
    """Only a new snapshot mends the change stream: rows changed that it does not carry.

    A change capture met what it cannot follow (a table dropped, renamed or
    created again, a partition truncated or detached, a change logged without
    its whole row, a slot or binlog position lost): reading on would skip or
    misapply changes, and no retry reads them. A person takes a new snapshot
    (``combined cdc teardown`` then ``combined cdc setup``, which the hint
    names), perhaps after fixing what caused it: ``needs_review``, exit 3.
    """

    run_state = "needs_review"


class StreamGap(NeedsSnapshot):
    """The stream left out changes that mending its cause does not bring back.

    A PostgreSQL publication that stopped publishing the captured table, or
    published it narrowed (a row filter, a column list), for a while: the
    server keeps no history of a publication, so once a person mends it the
    stream looks whole again while the changes of that time stay missing.
    The engine records it in the dataset's checkpoint (a lake commit that
    changes no row and keeps the position), and refuses every later capture
    of the dataset with it until a new snapshot (``combined cdc teardown``
    voids the checkpoint).
    """


class SchemaMismatch(SourceError):
    """A record does not fit the declared schema."""

    run_state = "needs_review"


class UnsupportedType(SourceError):
    """A source column has a type without a faithful Arrow mapping."""

    run_state = "needs_review"


class CaptureError(CombinedError):
    """The capture cannot be committed as it is."""


class DuplicateKeys(CaptureError):
    """A capture holds the same declared key more than once."""

    run_state = "needs_review"


class DriftRejected(CaptureError):
    """Schema drift whose policy is ``fail``."""

    run_state = "needs_review"
    #: Every drift event of the capture (class, field, outcome), set where raised.
    drift: tuple[dict[str, Any], ...] = ()
    #: The capture's staged parts (quarantine holds them for review).
    parts: tuple[Any, ...] = ()
    #: What drifted, in a few words (the message without what became of the capture).
    what: str = ""


class DriftQuarantined(DriftRejected):
    """Schema drift whose policy is ``quarantine``: the capture is held for review."""


class StagingLimitExceeded(CaptureError):
    """A run-scoped staging limit (bytes, files, path) was breached."""


class DiskFull(CaptureError):
    """A local file system a Run writes (its staging, a local lake) is full or read-only."""


class ReconciliationFailed(CaptureError):
    """What landed disagrees with what the source reported; nothing is published."""

    run_state = "needs_review"


class ProtocolViolation(CombinedError):
    """An invariant of the commit protocol would be broken."""


class DeliveryAltered(ProtocolViolation):
    """A staged Delivery's bytes or record count differ from what was recorded at staging."""

    run_state = "needs_review"


class LakeError(CombinedError):
    """The lake refused a write."""


class LakeNotWritable(LakeError):
    """The lake location cannot be written."""


class LakeUnreachable(LakeNotWritable):
    """The lake's store did not answer: unreachable, timed out, or failing (a 5xx).

    It may answer later: a worker waits for it (``runtime._lake_wait``). A
    store that answered and refused (no such bucket, credentials refused, a
    permission missing) is a :class:`LakeNotWritable`: a configuration to fix.
    """

    transient = True


class TableMissing(LakeError):
    """A dataset's table is gone from the lake, though the catalog recorded its versions.

    The bucket emptied, the prefix or the table's directory deleted, or
    ``lake:`` pointed elsewhere: writing the table afresh would lose its
    history, bill its rows' MAR again and (a change stream) resume from a
    checkpoint whose base is gone. No retry mends it; a person restores the
    lake or records a reset (``combined reset``): ``needs_review``, exit 3.
    """

    run_state = "needs_review"


class TableBehind(TableMissing):
    """A dataset's table is in the lake at a version older than the catalog recorded.

    The lake (or the table's directory) restored from a copy taken before the
    last capture: a capture over it would build on rows older than the
    catalog's, and its commits would take again the versions that earlier
    publications read. A person restores the newer copy or records a reset
    that removes the table (``combined reset --drop-table``): ``needs_review``.
    """


class CommitAmbiguous(CombinedError):
    """A lake commit may or may not have landed; resolved by reading the lake."""

    transient = True


class RunCanceled(CombinedError):
    """A person canceled the Run: nothing more of it is committed or acknowledged."""

    run_state = "canceled"
