"""The files a read covers: listed once, read exactly, checked unchanged afterwards.

A directory offers no snapshot: a writer may replace a file while it is
read. So a read lists its files with their size and modification time,
reads exactly that list, and stats them again once every row is read. A
file that changed or vanished meanwhile makes the read fail as transient
(:class:`~combined.errors.SourceUnavailable`, retried as another Attempt):
a half-changed file set is never committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from combined.errors import SourceError, SourceUnavailable

#: The snapshot authority receipts name: a listing verified unchanged by stat.
LISTING_AUTHORITY = "files:listing(size,mtime_ns,inode,ctime_ns)"

#: Which symbolic links a listing follows: those that stay inside the directory, or none.
FollowSymlinks = Literal["within", "never"]
FOLLOW_SYMLINKS: tuple[FollowSymlinks, ...] = ("within", "never")


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed file: its path relative to the root, size, times and inode.

    The inode and the status-change time catch what size and modification
    time miss: a file renamed into place over another (a new inode) whose
    writer kept the old size and set the old modification time.
    """

    name: str
    size: int
    mtime_ns: int
    inode: int = 0
    ctime_ns: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """The files of one read, in name order, under ``root``."""

    root: Path
    entries: tuple[Entry, ...]

    def paths(self) -> list[str]:
        """The absolute paths, in listing order."""
        return [str(self.root / e.name) for e in self.entries]

    def readable(self, fmt: str) -> Listing:
        """The files a read of format ``fmt`` reads: less the empty ones, but for Parquet.

        An empty CSV or JSON file holds no row (DuckDB would add a column0,
        or refuse the JSON), nor does a JSON file of an empty array (DuckDB
        refused it as "non-record JSON"); an empty Parquet file is broken,
        and is read to say so.
        """
        if fmt == "parquet":
            return self
        return Listing(
            self.root, tuple(e for e in self.entries if e.size and not self._no_record(e, fmt))
        )

    def _no_record(self, entry: Entry, fmt: str) -> bool:
        """Whether ``entry`` is a JSON file of an empty array (a few bytes, read to tell)."""
        if fmt != "json" or entry.size > 64:
            return False
        try:
            text = (self.root / entry.name).read_bytes()
        except OSError:
            return False  # (the read says why)
        return re.fullmatch(rb"\s*\[\s*\]\s*", text.removeprefix(b"\xef\xbb\xbf")) is not None

    @property
    def bytes(self) -> int:
        """The listed files' total size."""
        return sum(e.size for e in self.entries)

    def token(self) -> str:
        """The canonical text of the listing (the receipt publishes its digest)."""
        return json.dumps(
            [[e.name, e.size, e.mtime_ns, e.inode] for e in self.entries],
            separators=(",", ":"),
        )

    def digest(self) -> str:
        """A short digest of the listing."""
        return hashlib.sha256(self.token().encode()).hexdigest()[:32]

    def changed(self) -> list[str]:
        """The listed files that changed or vanished since they were listed."""
        out = []
        for e in self.entries:
            try:
                st = (self.root / e.name).stat()
            except OSError:
                out.append(e.name)
                continue
            if (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns) != (
                e.size,
                e.mtime_ns,
                e.inode,
                e.ctime_ns,
            ):
                out.append(e.name)
        return out

    def verify(self, relation: str) -> None:
        """Raise :class:`~combined.errors.SourceUnavailable` if a listed file changed."""
        changed = self.changed()
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise SourceUnavailable(
                f"file {changed[0]!r}{more} of {relation!r} changed or vanished during the "
                "read: nothing of it was committed",
                hint="the read is retried; if it keeps failing, have the writer write to a "
                "hidden temporary name (.name) and rename it when done",
                relation=relation,
                files=changed[:20],
            )


def check_root(path: str) -> Path:
    """The source's directory; raises if it is missing, not a directory or unreadable."""
    root = Path(path)
    if not root.exists():
        raise SourceUnavailable(
            f"the files directory {path!r} does not exist",
            hint="check the source's path, or mount the volume that holds it",
            path=path,
        )
    if not root.is_dir():
        raise SourceError(
            f"{path!r} is not a directory",
            hint="point the files source's path at the directory that holds the files",
            path=path,
        )
    if not os.access(root, os.R_OK | os.X_OK):
        raise SourceError(
            f"the files directory {path!r} is not readable by this process",
            hint="grant read and search (r-x) permission on it to the user Combined runs as",
            path=path,
        )
    return root


def _hidden(rel: Path) -> bool:
    # A writer's temporary file (.orders.csv.tmp) and a tool's marker
    # (_SUCCESS) are not data: skipping them lets a writer rename into place.
    return any(part.startswith((".", "_")) for part in rel.parts)


def _refuse_escape(
    path: Path, name: str, inside: Path, follow_symlinks: FollowSymlinks, relation: str
) -> None:
    """Refuse a listed file reached through a symbolic link the source does not allow.

    ``inside`` is the source's directory, resolved. With ``within`` a link
    may lead anywhere inside it; with ``never`` no link below it is followed.
    The message names the listed path and where it leads, never what it holds.
    """
    real = path.resolve()
    if real == inside / name:
        return  # no symbolic link between the directory and the file
    if follow_symlinks == "within" and real.is_relative_to(inside):
        return
    why = (
        "leads outside the source's directory"
        if not real.is_relative_to(inside)
        else "is reached through a symbolic link, and follow_symlinks is never"
    )
    raise SourceError(
        f"file {name!r} of {relation!r} {why} (it resolves to {str(real)!r}): it was not read",
        hint="Combined reads only files inside the source's directory: copy the file into "
        "it, point the source's path at a directory that holds it, or narrow the glob so "
        "that it does not match the link",
        relation=relation,
        file=name,
    )


def _refuse_dangling(path: Path, name: str, exc: OSError, relation: str) -> None:
    """Refuse a listed symbolic link that leads to no file (``exc``: why its stat failed).

    It was skipped as a file that vanished, so a snapshot deleted its rows from
    the lake while the link was still there: a target deleted or moved, a
    volume not mounted. A link removed on purpose is not listed at all.
    """
    try:
        target = os.readlink(path)
    except OSError:
        return  # not a link, or itself gone since the glob: it vanished
    raise SourceError(
        f"file {name!r} of {relation!r} is a symbolic link to {target!r}, which leads to no "
        f"file ({exc.strerror or type(exc).__name__}): nothing was read, and no row of it is "
        "deleted",
        hint="restore the file the link leads to (or mount its volume); if its rows are gone "
        "for good, remove the link (the next capture deletes them), or narrow the glob so "
        "that it does not match it",
        relation=relation,
        file=name,
    )


def list_files(
    root: Path, glob: str, relation: str, follow_symlinks: FollowSymlinks = "within"
) -> Listing:
    """List the regular files under ``root`` that ``glob`` matches, stat each once.

    Hidden names (a leading ``.`` or ``_`` in any part) are skipped. A name
    holding glob characters is refused: DuckDB would expand it as a pattern.
    A file that a symbolic link leads to outside ``root`` is refused (or any
    linked file, when ``follow_symlinks`` is ``never``): a link planted in
    the directory must not read another file of the host into the lake. A
    link that leads to no file is refused too (:func:`_refuse_dangling`).
    """
    inside = root.resolve()
    entries = []
    for path in root.glob(glob):
        rel = path.relative_to(root)
        if _hidden(rel):
            continue
        try:
            st = path.stat()
        except OSError as exc:
            _refuse_dangling(path, rel.as_posix(), exc, relation)
            continue  # vanished between the glob and the stat: not part of this listing
        if not path.is_file():
            continue
        name = rel.as_posix()
        if set("*?[") & set(name):
            raise SourceError(
                f"file {name!r} of {relation!r} has a glob character (* ? [) in its name, "
                "which the reader would expand as a pattern",
                hint="rename the file, or narrow the glob so that it does not match it",
                relation=relation,
                file=name,
            )
        _refuse_escape(path, name, inside, follow_symlinks, relation)
        entries.append(Entry(name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    entries.sort(key=lambda e: e.name)
    return Listing(root, tuple(entries))


__all__ = [
    "FOLLOW_SYMLINKS",
    "LISTING_AUTHORITY",
    "Entry",
    "FollowSymlinks",
    "Listing",
    "check_root",
    "list_files",
]
