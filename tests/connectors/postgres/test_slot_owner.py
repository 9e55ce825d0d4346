"""Whose a slot is, told by its publication's mark: every case of ``judge``."""

from __future__ import annotations

import pytest

from combined.connectors.abc import StreamOwner
from combined.connectors.postgres._slot_owner import Claim, judge, mark_of
from combined.errors import ConfigError

OURS = StreamOwner("a" * 32)
THEIRS = StreamOwner("b" * 32)


def _judge(
    claim: Claim, comment: str | None, *, slotted: bool, published: bool = True, made: bool = False
) -> bool:
    return judge("s", claim, published=published, comment=comment, slotted=slotted, made=made)


@pytest.mark.parametrize("slotted", [False, True])
def test_a_publication_marked_ours_is_ours(slotted: bool) -> None:
    assert _judge(Claim(OURS), mark_of(OURS), slotted=slotted) is False


def test_the_mark_holds_the_project_id_and_nothing_of_its_lake() -> None:
    # Every role of the server reads a publication's comment: it named the lake
    # (a local lake's absolute path) after the id.
    assert mark_of(OURS) == f"combined project {OURS.id}"


@pytest.mark.parametrize("slotted", [False, True])
def test_an_older_mark_naming_the_lake_is_ours_and_rewritten(slotted: bool) -> None:
    older = f"combined project {OURS.id}, lake /srv/ours/lake"
    assert _judge(Claim(OURS), older, slotted=slotted) is True
    with pytest.raises(ConfigError, match="another Combined project") as caught:
        _judge(Claim(THEIRS), older, slotted=slotted)
    assert "lake /srv/ours/lake" in caught.value.message  # (what the older mark says)


@pytest.mark.parametrize("claim", [Claim(OURS), Claim(OURS, resumed=True), Claim(None)])
@pytest.mark.parametrize("slotted", [False, True])
def test_a_publication_another_project_marked_is_refused(claim: Claim, slotted: bool) -> None:
    with pytest.raises(ConfigError, match="another Combined project") as caught:
        _judge(claim, mark_of(THEIRS), slotted=slotted)
    told = caught.value.describe()
    assert THEIRS.id in told and "`slot_prefix`" in told
    # The claimant's lake may have been wiped since it made them (a new lake, a new id).
    this = "this one has no id yet" if claim.owner is None else f"this one is project {OURS.id}"
    assert (
        f"made them before its lake was wiped or replaced (a new lake is a new project id: {this})"
        in told
    )
    assert "SELECT pg_drop_replication_slot('s')" in told and "DROP PUBLICATION s;" in told


@pytest.mark.parametrize("published", [False, True])
def test_a_slot_without_a_marked_publication_is_not_provably_ours(published: bool) -> None:
    with pytest.raises(ConfigError, match="nothing proves") as caught:
        _judge(Claim(OURS), None, slotted=True, published=published)
    told = caught.value.describe()
    assert "pg_drop_replication_slot('s')" in told and "`slot_prefix`" in told
    # The publication's owner may mark it instead (only one that exists).
    assert ("COMMENT ON PUBLICATION s IS" in told) is published
    assert (mark_of(OURS) in told) is published
    # ... only where no other project streams from the slot: marking it then would let
    # this project drop the other's slot as its own leftover (the hint offered it there)
    if published:
        assert told.index("COMMENT ON PUBLICATION") < told.index("otherwise")


def test_a_slot_the_project_streamed_from_is_its_own_and_marked() -> None:
    assert _judge(Claim(OURS, resumed=True), None, slotted=True) is True


@pytest.mark.parametrize(
    ("claim", "comment", "published", "marked"),
    [
        (Claim(OURS), None, True, True),
        (Claim(OURS), None, False, False),  # (made and marked in the same transaction)
        (Claim(OURS), "the dba's own note", True, False),  # never overwritten
        (Claim(None), None, True, False),  # no project named: nothing to mark it with
    ],
)
def test_a_publication_without_a_slot_is_taken(
    claim: Claim, comment: str | None, published: bool, marked: bool
) -> None:
    assert _judge(claim, comment, slotted=False, published=published) is marked


@pytest.mark.parametrize("published", [False, True])
def test_a_slot_the_lake_records_made_is_ours(published: bool) -> None:
    """(the lake's record of a slot made names this very slot: ``_made_here``)"""
    assert _judge(Claim(OURS), None, slotted=True, published=published, made=True) is published


def test_a_slot_the_lake_records_made_is_still_refused_when_another_project_marked_it() -> None:
    with pytest.raises(ConfigError, match="another Combined project"):
        _judge(Claim(OURS), mark_of(THEIRS), slotted=True, made=True)
