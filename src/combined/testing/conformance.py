"""The conformance suite every connector passes: built-in ones and yours.

Subclass :class:`SourceConformance` in a pytest module and give it a
``case`` fixture returning a :class:`ConformanceCase`: a way to build your
source over a dataset you filled with a known number of rows. pytest then
runs every ``test_*`` method against it::

    import pytest
    from combined.testing.conformance import ConformanceCase, SourceConformance

    class TestMySource(SourceConformance):
        @pytest.fixture
        def case(self, tmp_path):
            fill_my_api(rows=250)
            return ConformanceCase(
                connector=MySource,
                config={"base_url": "...", "token": "tok-3f9c2a71"},
                relation="orders",
                key=("id",),
                rows=250,
                secrets=("tok-3f9c2a71", "tok-wrong-88a1"),
                bad_config={"base_url": "...", "token": "tok-wrong-88a1"},
            )

What is checked, the contract of ``docs/connectors.md``:

* the class declares its name, revision and capabilities, and builds from
  its configuration;
* ``check`` connects; ``discover`` reports the dataset with its key columns
  and only strategies the capabilities allow;
* a read follows the extraction protocol: nothing is acquired before the
  first batch is asked for, batches never exceed ``batch_rows`` (memory is
  bounded by the batch, not the table), every row arrives, one final state
  comes last, the receipt is completed after the last batch, and the first
  terminal decision wins;
* a state survives a JSON round trip and reading from it again works (a
  cursor read from its final state hands over no more than its overlap);
* a read abandoned after its first batch is aborted cleanly, and the source
  reads again afterwards (cancellation);
* no text the connector produces (errors, receipts, discovery) holds any of
  ``secrets``, even when the credentials are refused.

Nothing here needs pytest itself, only its fixtures: the assertions are plain.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from combined.connectors.abc import (
    CursorSpec,
    Extraction,
    ReadRequest,
    Source,
    Strategy,
    supported_strategies,
)
from combined.errors import CombinedError, SourceError
from combined.protocol import RecordBatchMessage, StateMessage, TerminalReceipt

__all__ = ["ConformanceCase", "SourceConformance"]


@dataclass
class ConformanceCase:
    """One connector over one dataset of known content, for :class:`SourceConformance`."""

    connector: type[Source]
    """The connector class under test."""
    config: Mapping[str, Any]
    """Its configuration, secrets resolved (as the engine hands them over)."""
    relation: str
    """The relation to read, holding exactly ``rows`` rows."""
    key: tuple[str, ...]
    """The relation's key columns."""
    rows: int
    """How many rows the relation holds: at least ``3 * batch_rows`` shows batching."""
    batch_rows: int = 16
    """The batch bound every read is given."""
    secrets: Sequence[str] = ()
    """Credential values ``config`` and ``bad_config`` hold: none may appear in any text."""
    bad_config: Mapping[str, Any] | None = None
    """The same source with a credential it refuses (list it in ``secrets`` too);
    None when the source takes no credential."""
    cursor: CursorSpec | None = None
    """A cursor to read by, when the connector supports cursor reads of this relation."""
    overlap: int = 0
    """Rows a cursor read from its own final state may hand over again (its lookback)."""
    read_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``ReadRequest.options`` the connector needs."""

    def source(self, config: Mapping[str, Any] | None = None) -> Source:
        """A new source built from ``config`` (default: :attr:`config`)."""
        return self.connector(dict(self.config if config is None else config))

    def request(
        self, strategy: Strategy = "snapshot", state: Mapping[str, Any] | None = None
    ) -> ReadRequest:
        """A read of :attr:`relation` in ``strategy`` from ``state``."""
        return ReadRequest(
            dataset=self.relation.rsplit(".", 1)[-1],
            relation=self.relation,
            key=self.key,
            strategy=strategy,
            state=state,
            cursor=self.cursor if strategy == "cursor" else None,
            batch_rows=self.batch_rows,
            options=dict(self.read_options),
        )


@dataclass
class _Read:
    batches: list[Any]
    states: list[StateMessage]
    order: list[str]
    terminal: TerminalReceipt

    @property
    def rows(self) -> int:
        return sum(batch.num_rows for batch in self.batches)


def _read_all(extraction: Extraction) -> _Read:
    batches: list[Any] = []
    states: list[StateMessage] = []
    order: list[str] = []
    try:
        for message in extraction:
            if isinstance(message, RecordBatchMessage):
                batches.append(message.batch)
                order.append("batch")
            else:
                assert isinstance(message, StateMessage), f"not a message: {message!r}"
                states.append(message)
                order.append("state")
    except BaseException:
        extraction.finish("abort")
        raise
    return _Read(batches, states, order, extraction.finish("success"))


def _with(source: Source, use: Callable[[Source], Any]) -> Any:
    try:
        return use(source)
    finally:
        source.close()


def _texts(value: Any) -> Iterator[str]:
    """Every text a value shows a person: its repr, and an error's description and context."""
    yield repr(value)
    if isinstance(value, CombinedError):
        yield value.describe()
        yield repr(value.context)
        yield repr(pickle.loads(pickle.dumps(value)).__reduce__())
    elif isinstance(value, BaseException):
        yield str(value)


class SourceConformance:
    """The contract every connector meets; subclass it with a ``case`` fixture."""

    def _assert_no_secret(self, case: ConformanceCase, *values: Any) -> None:
        for value in values:
            for text in _texts(value):
                for secret in case.secrets:
                    assert secret not in text, "a credential value appears in a text"

    # -- declaration --------------------------------------------------------------------

    def test_declares_its_name_revision_and_capabilities(self, case: ConformanceCase) -> None:
        """The class states what it is and what it reads, as class constants."""
        cls = case.connector
        assert isinstance(cls.name, str) and cls.name, "name: the registered connector name"
        assert isinstance(cls.revision, str) and cls.revision, "revision: frozen in admissions"
        assert supported_strategies(cls), "a connector reads at least one strategy"
        assert cls.CONFIG_KEYS is None or all(isinstance(k, str) for k in cls.CONFIG_KEYS)
        _with(case.source(), lambda source: isinstance(source, Source) or _fail("not a Source"))

    # -- check and discover -------------------------------------------------------------

    def test_check_connects(self, case: ConformanceCase) -> None:
        """``check`` returns quietly against a reachable source with good credentials."""
        _with(case.source(), lambda source: source.check())

    def test_discover_reports_the_dataset_and_its_key(self, case: ConformanceCase) -> None:
        """Discovery lists the relation, its key columns among its fields, allowed strategies."""
        discovery = _with(case.source(), lambda source: source.discover())
        found = discovery.dataset(case.relation)
        assert found is not None, f"discovery does not list {case.relation!r}"
        names = {f.name for f in found.fields}
        assert set(case.key) <= names, f"key {case.key} not among the fields {sorted(names)}"
        assert set(found.strategies) <= set(supported_strategies(case.connector))
        self._assert_no_secret(case, discovery)

    # -- reading ------------------------------------------------------------------------

    def test_a_read_follows_the_extraction_protocol(self, case: ConformanceCase) -> None:
        """Lazy start, bounded batches, every row, one final state last, first decision wins."""

        def read(source: Source) -> _Read:
            extraction = source.read(case.request())
            assert not extraction.receipt.acquired, "the read started before it was iterated"
            done = _read_all(extraction)
            assert extraction.finish("abort") is done.terminal, "a second decision replaced"
            assert extraction.receipt.completed, "the receipt is not completed after the read"
            return done

        done = _with(case.source(), read)
        assert all(b.num_rows <= case.batch_rows for b in done.batches), "a batch over the bound"
        assert done.rows == case.rows, f"{done.rows} rows read, the relation holds {case.rows}"
        assert done.order and done.order[-1] == "state", "the read does not end with a state"
        assert done.states[-1].final, "the last state is not marked final"
        assert done.terminal.outcome == "success" and done.terminal.cleanup_succeeded
        self._assert_no_secret(case, done.terminal, *done.states)

    def test_a_state_survives_json_and_reading_from_it_works(self, case: ConformanceCase) -> None:
        """States are JSON; a cursor read from its final state hands over at most its overlap."""
        strategy: Strategy = "cursor" if case.cursor is not None else "snapshot"
        first = _with(case.source(), lambda source: _read_all(source.read(case.request(strategy))))
        state = json.loads(json.dumps(dict(first.states[-1].state)))
        again = _with(
            case.source(), lambda source: _read_all(source.read(case.request(strategy, state)))
        )
        if strategy == "cursor":
            assert again.rows <= case.overlap, f"{again.rows} rows again from the final state"
        else:
            assert again.rows == case.rows, "a snapshot from a state reads the whole relation"

    def test_a_read_abandoned_after_one_batch_aborts_cleanly(self, case: ConformanceCase) -> None:
        """Cancellation: abort mid-read releases the read; the source reads again afterwards."""

        def abandon(source: Source) -> tuple[TerminalReceipt, _Read]:
            extraction = source.read(case.request())
            first = next(iter(extraction))
            assert isinstance(first, RecordBatchMessage | StateMessage)
            aborted = extraction.finish("abort")
            return aborted, _read_all(source.read(case.request()))

        aborted, again = _with(case.source(), abandon)
        assert aborted.outcome == "abort" and aborted.cleanup_succeeded, aborted
        assert again.rows == case.rows, "the source does not read again after an abort"

    # -- credentials --------------------------------------------------------------------

    def test_refused_credentials_leave_no_secret_in_any_text(self, case: ConformanceCase) -> None:
        """A refused credential is a ``SourceError`` whose every text is free of secrets."""
        if case.bad_config is None:
            return  # the source takes no credential
        try:
            source = case.source(case.bad_config)
        except CombinedError as exc:  # refused when built: still no secret
            self._assert_no_secret(case, exc)
            return
        try:
            source.check()
        except SourceError as exc:
            self._assert_no_secret(case, exc)
        else:
            raise AssertionError("check() accepted the refused credential")
        finally:
            source.close()


def _fail(message: str) -> bool:
    raise AssertionError(message)
