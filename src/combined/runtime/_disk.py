"""A Run stopped by a full or read-only disk, told as such: where, and what to do.

The error a writer meets (``[Errno 28] Error writing bytes to file``, from
Arrow, DuckDB or delta-rs) names neither the file system nor the Run's
places on it: an alert saying only that left whoever is paged to find which
disk of which machine. :func:`disk_error` names the places the Run writes on
this machine and the remedies.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from combined.errors import DiskFull

if TYPE_CHECKING:
    from combined.lake import LakeLayout

#: The errors of a file system that takes no more writes, and how each is told.
_FULL = {
    errno.ENOSPC: ("has no space left", "No space left on device"),
    errno.EDQUOT: ("is over its disk quota", "Disk quota exceeded"),
    errno.EROFS: ("is read-only", "Read-only file system"),
}


def _which(exc: BaseException) -> str | None:
    """How the file system failed, from ``exc`` or the errors it was raised from."""
    seen: BaseException | None = exc
    for _ in range(8):  # (a chain of causes, never a cycle)
        if seen is None:
            return None
        code = getattr(seen, "errno", None)
        if code in _FULL:
            return _FULL[code][0]
        for said, text in _FULL.values():
            if text in str(seen):  # (delta-rs and DuckDB say it in their message)
                return said
        seen = seen.__cause__ or seen.__context__
    return None


def disk_error(exc: BaseException, layout: LakeLayout) -> DiskFull | None:
    """The error a Run ends with when ``exc`` is a full or read-only disk; None otherwise."""
    said = _which(exc)
    if said is None:
        return None
    places = [f"its staging under {layout.staging_area()}"]
    if not layout.store.remote:
        places.append(f"its tables and raw layer under {layout.store.root}")
    return DiskFull(
        f"a file system this Run writes on this machine {said}: {' and '.join(places)} ({exc})",
        hint="free space there (or grow the volume, or make it writable) and capture again "
        "(a schedule's next tick does); a `staging: {max_bytes: ...}` below the space it "
        "has stops a large capture with a clear error before the disk fills",
    )
