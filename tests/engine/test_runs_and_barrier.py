"""The Run state machine and the checkpoint barrier."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combined.catalog import RUN_STATES, TERMINAL, TRANSITIONS, check_transition
from combined.errors import ProtocolViolation
from combined.runtime._barrier import CheckpointBarrier

LEGAL = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets)]
ILLEGAL = [(a, b) for a, b in itertools.product(RUN_STATES, RUN_STATES) if b not in TRANSITIONS[a]]


def test_the_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(RUN_STATES)
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()  # a finished run never moves again
    assert ("queued", "extracting") in LEGAL and ("committing", "succeeded") in LEGAL


@pytest.mark.parametrize(("current", "target"), LEGAL)
def test_legal_moves_are_accepted(current: Any, target: Any) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("succeeded", "extracting"),
        ("queued", "succeeded"),
        ("failed", "committing"),
        ("committing", "extracting"),
        ("needs_auth", "queued"),
        ("extracting", "extracting"),
    ],
)
def test_named_illegal_moves_raise(current: Any, target: Any) -> None:
    with pytest.raises(ProtocolViolation, match=f"from {current} to {target}"):
        check_transition(current, target)


@pytest.mark.parametrize(("current", "target"), ILLEGAL)
def test_every_illegal_move_raises(current: Any, target: Any) -> None:
    with pytest.raises(ProtocolViolation):
        check_transition(current, target)


# A stream: ("records", n) or ("state", index), in order.
events = st.lists(
    st.one_of(
        st.tuples(st.just("records"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("state"), st.just(0)),
    ),
    max_size=40,
)


@given(events=events, data=st.data())
def test_barrier_never_runs_ahead_of_committed_records(
    events: list[tuple[str, int]], data: st.DataObject
) -> None:
    barrier = CheckpointBarrier()
    emitted = 0
    pins: list[tuple[int, dict[str, int], str]] = []  # (records before it, state, position)
    for kind, n in events:
        if kind == "records":
            barrier.records(n)
            emitted += n
        else:
            state = {"i": len(pins)}
            position = f"pos-{len(pins)}"
            barrier.state(state, position)
            pins.append((emitted, state, position))
    assert barrier.emitted == emitted
    through = data.draw(st.integers(min_value=0, max_value=emitted + 5), label="through")

    got = barrier.committable(through)
    qualifying = [(s, p) for before, s, p in pins if before <= through]
    if not qualifying:
        assert got is None
        return
    assert got is not None
    index = int(got[0]["i"])
    assert pins[index][0] <= through  # never pinned after uncommitted records
    assert got == qualifying[-1]  # the newest one that qualifies


def test_barrier_example() -> None:
    barrier = CheckpointBarrier()
    assert barrier.committable(0) is None
    barrier.state({"c": 0})
    barrier.records(10)
    barrier.state({"c": 10}, "p10")
    barrier.records(5)
    barrier.state({"c": 15}, "p15")
    assert barrier.committable(9) == ({"c": 0}, None)
    assert barrier.committable(10) == ({"c": 10}, "p10")
    assert barrier.committable(14) == ({"c": 10}, "p10")
    assert barrier.committable(15) == ({"c": 15}, "p15")
    with pytest.raises(ValueError):
        barrier.records(-1)
