"""Files Combined creates are its owner's alone: 0600 files, 0700 directories.

The lake holds the captured rows, the catalog their history, quarantine and
staging the rows held back or in flight: none is for other local users.
Combined writes some of these files itself and lets libraries write the
others (delta-rs writes the Delta tables, SQLite its journal, DuckDB its
spill files), so the one lever that reaches them all is the process umask:
:func:`restrict_umask` adds ``077`` to it when an engine opens a project (a
stricter umask stays as it is). The directories Combined creates at the top
of the lake and for the catalog are also made ``0700`` explicitly, so that
what lies beneath stays out of reach even if a host process later loosens
the umask.

To share a lake with a group, give its directory a default ACL
(``setfacl -d -m g:analysts:rX lake``): files created under a directory with
a default ACL take their mode from the ACL, not from the umask.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The permission bits Combined never grants: group's and others'.
OTHERS = 0o077


def restrict_umask() -> None:
    """Add ``077`` to this process's umask, keeping whatever else it masks."""
    previous = os.umask(OTHERS)
    os.umask(previous | OTHERS)


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) as ``0700`` directories; leave an existing one."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(p, 0o700)  # the mode mkdir takes is masked by the umask


def private_file(path: Path) -> None:
    """Create ``path`` empty and ``0600`` unless it exists."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return
