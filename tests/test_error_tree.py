"""The error tree: what only a new snapshot mends ends ``needs_review``, never ``failed``."""

from __future__ import annotations

import ast
import importlib
import inspect
import pickle
import pkgutil

import pytest

import combined.connectors.mariadb
import combined.connectors.postgres
from combined import errors
from combined.connectors.mariadb._binlog_setup import BinlogGone
from combined.connectors.postgres._replication import SlotLost
from combined.errors import CombinedError, NeedsSnapshot, SourceError, StreamGap

#: What a hint names when it takes a new snapshot (the connectors' command pairs).
_RESNAPSHOT_WORDS = ("RECOVER_HINT", "RESNAPSHOT", "_ROW_IMAGE_FIX", "cdc teardown")

#: Errors whose hint names a new snapshot, yet another way out mends them: they stay.
_OTHER_WAY_OUT = {
    # a server filtering its binlog: a configuration error `combined check` tells (exit 2)
    ("combined.connectors.mariadb._binlog_setup", "_refuse_binlog_filters", "ConfigError"),
    # a dsn naming another database than the slot's: pointing it back mends it
    ("combined.connectors.postgres._replication", "require_slot", "SourceError"),
    # a table without its primary key for a moment (a migration): a later capture passes
    ("combined.connectors.mariadb._binlog_fill", "_keyless_now", "SourceError"),
}


@pytest.mark.parametrize("cls", [NeedsSnapshot, SlotLost, BinlogGone, StreamGap])
def test_what_only_a_new_snapshot_mends_ends_needs_review(cls: type[NeedsSnapshot]) -> None:
    """SlotLost and BinlogGone are the first two of the kind; the rest ended ``failed``."""
    assert issubclass(cls, NeedsSnapshot) and issubclass(cls, SourceError)
    assert cls.run_state == "needs_review" and not cls.transient
    err = cls("gone", hint="run `combined cdc teardown` then `combined cdc setup`", slot="s")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.hint == err.hint and back.context == {"slot": "s"}
    assert cls.__name__ in (errors.__doc__ or "")  # the tree's diagram names it


def _raising_sites() -> list[tuple[str, str, str, type[CombinedError]]]:
    """(module, function, line, error class) of each error built in the cdc connectors
    with a hint that takes a new snapshot."""
    found = []
    for package in (combined.connectors.postgres, combined.connectors.mariadb):
        for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            tree = ast.parse(inspect.getsource(module))
            source = inspect.getsource(module)
            for func in ast.walk(tree):
                if not isinstance(func, ast.FunctionDef):
                    continue
                for call in ast.walk(func):
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                        continue
                    cls = getattr(module, call.func.id, None)
                    hint = next((k.value for k in call.keywords if k.arg == "hint"), None)
                    if not (inspect.isclass(cls) and issubclass(cls, CombinedError) and hint):
                        continue
                    text = ast.get_source_segment(source, hint) or ""
                    if any(word in text for word in _RESNAPSHOT_WORDS):
                        found.append((info.name, func.name, str(call.lineno), cls))
    return found


def test_every_error_whose_way_out_is_a_new_snapshot_ends_needs_review() -> None:
    """A partial row image, a RENAME TABLE or a partition DDL in the binlog, a table dropped
    and created again, a partition detached, a publication dropped: their hints said to take
    a new snapshot while their Runs ended ``failed``, which schedules and ``cdc follow``
    retried for ever and alerts told as "retry later"."""
    sites = _raising_sites()
    assert len(sites) > 20  # (the scan finds them)
    wrong = [
        f"{module}:{func}:{line} raises {cls.__name__}"
        for module, func, line, cls in sites
        if cls.run_state != "needs_review" and (module, func, cls.__name__) not in _OTHER_WAY_OUT
    ]
    assert wrong == []
    assert {(m, f, c.__name__) for m, f, _, c in sites} >= _OTHER_WAY_OUT  # (none stale)
