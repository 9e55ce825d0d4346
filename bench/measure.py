"""Measurement helpers: peak RSS of a process tree and bytes written under a directory.

Linux only (``/proc``); psutil is not needed.

* :class:`TreeSampler` polls ``/proc/<pid>/status`` of a process and all its
  descendants: it keeps the highest *sum* of ``VmRSS`` over the tree (what
  the tree held at once) and the highest ``VmHWM`` of any one member (exact
  for a single process, even between polls).
* :func:`timed_child` runs ``python ARGV`` in a fresh process and measures
  it alone: exit code, wall, peak RSS, CPU-seconds.
* :func:`snapshot_dir` / :func:`written` diff two listings of a directory:
  bytes of files that are new or changed, new files, and new Parquet data
  files (outside ``_delta_log``).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

KIB = 1024
MIB = 1024 * 1024


def read_status(pid: int | str, proc: Path = Path("/proc")) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process in bytes (empty when it is gone)."""
    out: dict[str, int] = {}
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * KIB  # the kernel reports kB
    return out


def _pids(proc: Path) -> list[str] | None:
    """The process ids listed in ``proc`` (None when it cannot be listed)."""
    try:
        return [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return None


def _named_stats(name: str, proc: Path) -> dict[int, list[str]] | None:
    """The ``stat`` fields (after ``pid (comm)``) of every process called ``name``."""
    out: dict[int, list[str]] = {}
    for pid in _pids(proc) or []:
        fields = _stat_fields(proc / pid / "stat", name)
        if fields is not None:
            out[int(pid)] = fields
    return out


def _stat_fields(path: Path, name: str) -> list[str] | None:
    try:
        stat = path.read_text()
    except OSError:
        return None
    if stat[stat.find("(") + 1 : stat.rfind(")")] != name:
        return None
    # After "pid (comm)", 0-based: state, ppid, ..., utime 11, stime 12,
    # cutime 13, cstime 14 (fields 14-17 of proc(5)), starttime 19 (field 22).
    fields = stat.rsplit(")", 1)[-1].split()
    return fields if len(fields) >= 20 else None


@dataclass(frozen=True)
class ServerCpu:
    """One reading of a server's CPU: seconds so far, and which postmasters they cover."""

    seconds: float
    #: (pid, start time) of each postmaster read: two readings compare only if equal.
    postmasters: frozenset[tuple[int, int]]

    def since(self, earlier: ServerCpu | None) -> float | None:
        """CPU seconds between ``earlier`` and this reading (None when not comparable).

        A postmaster that restarted, started or stopped in between resets its
        reaped time: the difference would mean nothing.
        """
        if earlier is None or earlier.postmasters != self.postmasters:
            return None
        delta = self.seconds - earlier.seconds
        return delta if delta >= 0 else None


def postmaster_of(dsn: str, proc: Path = Path("/proc")) -> int | None:
    """The process id of the postmaster serving ``dsn`` (None: not on this host).

    A backend's parent is its postmaster; the connection's own backend is read
    while it is alive.
    """
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        fields = None if row is None else _stat_fields(proc / str(row[0]) / "stat", "postgres")
    return None if fields is None else int(fields[1])


def server_cpu(
    name: str = "postgres",
    proc: Path = Path("/proc"),
    attempts: int = 20,
    postmaster: int | None = None,
) -> ServerCpu | None:
    """The CPU (user + system) the server processes called ``name`` have used so far.

    Live processes count their own time; a backend that has exited counts in
    its parent's reaped-children time (the postmaster's), so the difference
    of two readings is the server's CPU between them, connections that came
    and went included. With ``postmaster`` only that server counts (itself
    and its children: :func:`postmaster_of`); without it every process of
    that name on the host does, other clusters too, and a cluster started or
    stopped in between makes two readings incomparable. A backend reaped
    while the processes are being read would be missed (or, read before its
    postmaster, counted twice): the reading is taken again, a moment later,
    until the postmasters' reaped time held still across it, and is None if
    it never did in ``attempts`` (a server opening and closing connections
    all the time), or when no such process is visible (a server on another
    host).
    """
    ticks = os.sysconf("SC_CLK_TCK")
    stats = _server_stats(name, proc, postmaster)
    for attempt in range(attempts):
        if not stats:
            return None
        masters = _postmasters(stats)
        before = [_reaped(proc / str(pid) / "stat", name) for pid in masters]
        stats = _server_stats(name, proc, postmaster)
        after = [_reaped(proc / str(pid) / "stat", name) for pid in masters]
        if stats and before == after:
            break
        time.sleep(0.001 * attempt)
    else:
        return None
    masters = _postmasters(stats)
    total = sum(int(f[11]) + int(f[12]) for f in stats.values())
    # The postmasters' exited backends' time.
    total += sum(int(stats[pid][13]) + int(stats[pid][14]) for pid in masters)
    started = frozenset((pid, int(stats[pid][19])) for pid in masters)  # starttime
    return ServerCpu(total / ticks, started)


def _server_stats(name: str, proc: Path, postmaster: int | None) -> dict[int, list[str]] | None:
    """:func:`_named_stats`, only ``postmaster`` and its children when it is given."""
    stats = _named_stats(name, proc)
    if postmaster is None or not stats:
        return stats
    return {pid: f for pid, f in stats.items() if postmaster in (pid, int(f[1]))}


def _postmasters(stats: dict[int, list[str]]) -> list[int]:
    """The processes of ``stats`` whose parent is not one of them."""
    return [pid for pid, fields in stats.items() if int(fields[1]) not in stats]


def _reaped(path: Path, name: str) -> int | None:
    fields = _stat_fields(path, name)
    return None if fields is None else int(fields[13]) + int(fields[14])


def parent_map(proc: Path = Path("/proc")) -> dict[int, int]:
    """``{pid: ppid}`` of every process visible in ``proc``."""
    out: dict[int, int] = {}
    for entry in _pids(proc) or []:
        try:
            stat = (proc / entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 2 and fields[1].lstrip("-").isdigit():
            out[int(entry)] = int(fields[1])
    return out


def tree(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and all its descendants under ``parents`` (``{pid: ppid}``)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


@dataclass
class TreePeak:
    """What a sampler saw."""

    tree_rss: int = 0  # highest sum of VmRSS over the tree at one poll
    max_hwm: int = 0  # highest VmHWM of any one process of the tree
    samples: int = 0
    processes: int = 0  # distinct pids seen

    @property
    def peak(self) -> int:
        """The peak RSS of the tree: the larger of the two bounds."""
        return max(self.tree_rss, self.max_hwm)


class TreeSampler:
    """Poll a process tree's memory from a background thread until stopped."""

    def __init__(self, root: int, interval_s: float = 0.05, proc: Path = Path("/proc")) -> None:
        self.root = root
        self.interval_s = interval_s
        self.proc = proc
        self.result = TreePeak()
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        """Take one sample now."""
        pids = tree(self.root, parent_map(self.proc))
        total = 0
        for pid in pids:
            status = read_status(pid, self.proc)
            if not status:
                continue
            self._seen.add(pid)
            total += status.get("VmRSS", 0)
            self.result.max_hwm = max(self.result.max_hwm, status.get("VmHWM", 0))
        self.result.tree_rss = max(self.result.tree_rss, total)
        self.result.samples += 1
        self.result.processes = len(self._seen)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> TreeSampler:
        """Start polling."""
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        """Stop polling and return the peak."""
        self._stop.set()
        self._thread.join()
        return self.result


def own_peak_rss() -> dict[str, int]:
    """This process's ``VmHWM`` and its waited-for children's max RSS, in bytes."""
    hwm = read_status("self").get("VmHWM", 0)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * KIB  # kB on Linux
    return {"self_hwm": hwm, "children_maxrss": children}


# -- directories ---------------------------------------------------------------------------

Listing = dict[str, tuple[int, int, int]]


def snapshot_dir(root: Path) -> Listing:
    """``{relative path: (size, mtime_ns, inode)}`` of every file under ``root`` (empty if absent).

    The inode tells hard links apart from copies: a file linked under two
    paths was written once.
    """
    out: Listing = {}
    if not root.exists():
        return out
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:  # removed while walking
                continue
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


@dataclass(frozen=True)
class Written:
    """The difference between two listings of one directory."""

    bytes: int  # size of files that are new or changed
    files: int  # files that are new or changed
    data_files: int  # new or changed .parquet files outside any _delta_log and the ledger
    data_bytes: int
    net_bytes: int  # total size after minus total size before
    linked_bytes: int = 0  # new paths that are hard links of a file counted already

    def as_dict(self) -> dict[str, int]:
        """A JSON-ready copy."""
        return {
            "bytes": self.bytes,
            "files": self.files,
            "data_files": self.data_files,
            "data_bytes": self.data_bytes,
            "net_bytes": self.net_bytes,
            "linked_bytes": self.linked_bytes,
        }


def written(before: Listing, after: Listing) -> Written:
    """What was written between two listings (deleted files write nothing).

    A new path whose inode was already counted (a hard link) writes no bytes:
    it is reported as ``linked_bytes``.
    """
    nbytes = files = data_files = data_bytes = linked = 0
    seen = {entry[2] for rel, entry in after.items() if before.get(rel) == entry}
    for rel, (size, mtime, ino) in sorted(after.items()):
        if before.get(rel) == (size, mtime, ino):
            continue
        if ino in seen:
            linked += size
            continue
        seen.add(ino)
        nbytes += size
        files += 1
        parts = Path(rel).parts
        # The governance ledger (``_combined/``, docs/readers.md) records each
        # publication and Run: bookkeeping, not the data a capture writes.
        if rel.endswith(".parquet") and "_delta_log" not in parts and "_combined" not in parts:
            data_files += 1
            data_bytes += size
    net = sum(e[0] for e in after.values()) - sum(e[0] for e in before.values())
    return Written(nbytes, files, data_files, data_bytes, net, linked)


#: The parent :func:`timed_child` starts: it runs ``python ARGV`` and reports
#: its child's exit code, wall, peak RSS (MB) and CPU-s (user + system), then
#: the child's last line of output; the child's stderr tail follows on its own.
_TIMED = (
    "import resource, subprocess, sys, time;"
    "t = time.monotonic();"
    "r = subprocess.run([sys.executable, *sys.argv[1:]], capture_output=True, text=True);"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "print(r.returncode, time.monotonic() - t, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime);"
    "print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else '');"
    "sys.stderr.write(r.stderr[-2000:])"
)


def timed_child(
    argv: Sequence[str], cwd: Path | None = None
) -> tuple[int, float, float, float, str, str]:
    """Run ``python ARGV`` fresh, measured alone by a parent of its own.

    Returns its exit code, wall seconds, peak RSS in MB, CPU-seconds, the
    last line it printed and the tail of its standard error. The parent's
    ``RUSAGE_CHILDREN`` covers that one child: this process's other children
    (earlier cases) never count in it.
    """
    out = subprocess.run(
        [sys.executable, "-c", _TIMED, *argv], cwd=cwd, capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    rc, wall, rss, cpu = lines[0].split()
    last = lines[1] if len(lines) > 1 else ""
    return int(rc), float(wall), float(rss), float(cpu), last, out.stderr
