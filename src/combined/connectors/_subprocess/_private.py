"""The private directory of a program run, and the sweep of those whose owner died.

A run's configuration (secrets resolved) lives in a 0700 directory under the
temporary directory, removed when the run ends however it ends, and by the
``atexit`` hook of an interpreter that exits with a run open. A process killed
outright (SIGKILL) runs neither: its directory stays. So each directory's name
records its owner, ``combined-<connector>-<pid>-<start>-<host>-<random>``:

- ``pid`` and ``start``, the process's start time (clock ticks since boot,
  from ``/proc``): a pid reused by another process has another start time;
- ``host``, a digest of the boot id and the pid namespace: a pid means
  nothing on another boot or in another container sharing the directory.

:func:`sweep` removes the directories of this user whose owner is dead,
and is run before each new directory is made and before each engine Run.
It never removes one whose owner may be alive: a directory of another host,
boot or pid namespace, of another user, or named otherwise (made before
owners were recorded) stays. Where ``/proc`` is missing (macOS), ``start``
is 0 and a directory stays as long as any process holds its pid.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The name of a private directory: prefix, owner (pid, start, host), mkdtemp's random part.
_NAME = re.compile(
    r"^combined-(?:[a-z][a-z0-9_]*-)?(?P<pid>[0-9]+)-(?P<start>[0-9]+)-(?P<host>[0-9a-f]{8})"
    r"-[a-z0-9_]+$"
)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who made a private directory: a process on a host (boot and pid namespace)."""

    pid: int
    start: int
    """The process's start time in clock ticks since boot; 0 where it cannot be read."""
    host: str
    """8 hex digits naming the boot and the pid namespace (or the host name without /proc)."""

    def tag(self) -> str:
        """The owner as written in a directory name: ``<pid>-<start>-<host>``."""
        return f"{self.pid}-{self.start}-{self.host}"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of process ``pid``; None when there is none.

    Raises ``OSError`` when ``/proc`` cannot say (no ``/proc``, not readable).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", errors="replace")
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            raise
        return None
    except ProcessLookupError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime)


def _host() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            where = f.read().strip() + os.readlink("/proc/self/ns/pid")
    except OSError:
        where = socket.gethostname()
    return hashlib.sha256(where.encode()).hexdigest()[:8]


_ME: Owner | None = None


def current_owner() -> Owner:
    """This process as the owner of the directories it makes."""
    global _ME
    pid = os.getpid()
    if _ME is None or _ME.pid != pid:  # computed once per process (a fork is another)
        try:
            found = _proc_stat(pid)
        except (OSError, ValueError, IndexError):
            found = None
        _ME = Owner(pid, found[1] if found else 0, _host())
    return _ME


def owner_of(name: str) -> Owner | None:
    """The owner recorded in a private directory's name; None if it records none."""
    match = _NAME.match(name)
    if match is None:
        return None
    return Owner(int(match["pid"]), int(match["start"]), match["host"])


def is_dead(owner: Owner, me: Owner) -> bool:
    """Whether ``owner`` has surely ended, seen from process ``me``; False when unsure."""
    if owner.host != me.host:
        return False  # another boot, host or pid namespace: its pids are not ours to read
    if owner.pid == me.pid:
        return owner.start != me.start
    try:
        found = _proc_stat(owner.pid)
    except (OSError, ValueError, IndexError):
        # No /proc: only a pid that no process holds is surely dead.
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    if found is None:
        return True
    state, start = found
    # A zombie has ended; a start time of 0 recorded means it could not be read.
    return state in ("Z", "X") or (owner.start != 0 and start != owner.start)


def sweep(root: str | Path | None = None) -> list[Path]:
    """Remove this user's private directories under ``root`` whose owner is dead.

    ``root`` defaults to the temporary directory. Returns what was removed;
    never raises (a sweep that cannot read a directory leaves it).
    """
    base = Path(root if root is not None else tempfile.gettempdir())
    me = current_owner()
    uid = os.geteuid()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        owner = owner_of(entry.name)
        if owner is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or not is_dead(owner, me):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


class PrivateDir:
    """A directory only this user can read (0700), for the files a program run reads.

    The program's configuration (secrets resolved) is written to
    ``config.json`` with mode 0600; :meth:`remove` deletes everything,
    whatever happened. Its name records this process as its owner, and
    making one first removes those whose owner died (:func:`sweep`).
    """

    def __init__(self, prefix: str = "combined-") -> None:
        with contextlib.suppress(Exception):  # a failed sweep never fails a run
            sweep()
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{current_owner().tag()}-"))
        os.chmod(self.path, 0o700)
        #: What each file was written with, by name (to see what the program changed).
        self.written: dict[str, Any] = {}

    def write(self, name: str, data: Any) -> str:
        """Write ``data`` as JSON to a new 0600 file; return its path."""
        # Exact numbers as their digits: a state's Decimal bookmark goes back as it came.
        from combined.connectors._subprocess._state import exact_json

        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(exact_json(data))
        self.written[name] = data
        return str(path)

    def remove(self) -> None:
        """Delete the directory and every file in it."""
        shutil.rmtree(self.path, ignore_errors=True)
