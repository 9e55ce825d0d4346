"""A connector program (a Singer tap, an Airbyte source) as a child process.

Bounded pipes, its own process group, always reaped, killed with Combined.
The program runs in a new session, so it leads its own process group and
:meth:`ChildProcess.stop` can end every process it started (a program that
spawns helpers leaves no orphan); on Linux the kernel kills the program
when Combined dies, even by SIGKILL (:mod:`._spawn`). Standard output is
read by one thread into a queue bounded in reads and in bytes (back-pressure:
memory is bounded by the queue, never by what the program writes); standard error by another
thread that keeps only a bounded tail, so a program that logs without end
can never block on a full pipe. Log lines the program writes as protocol messages (Airbyte ``LOG``)
join the same tail through :meth:`ChildProcess.log`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO

from combined.connectors._subprocess._spawn import spawn

#: How much of the program's log (standard error, LOG messages) is kept for error messages.
STDERR_TAIL_BYTES = 8 * 1024
#: How much is held to cut it from: twice as much, masked before it is cut, so that the
#: first bytes held (a secret's end, its start dropped with an older chunk) are never shown.
_TAIL_HELD = 2 * STDERR_TAIL_BYTES
#: Reads of standard output held ahead of the consumer (each: the lines one read completed).
QUEUE_LINES = 256
#: Bytes of lines read ahead of the consumer: many small lines, or one line of any size.
QUEUE_BYTES = 16 * 1024 * 1024
#: Bytes asked of the pipe at a time: the lines each read completes go to the consumer
#: together (one hand-off between threads a line cost more than decoding it).
READ_BYTES = 256 * 1024
#: How long a program gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0

_EOF = object()
_STOPPED = object()


class LineTooLong(Exception):
    """The program wrote a line longer than the limit (its number is ``line``)."""

    def __init__(self, line: int, limit: int) -> None:
        super().__init__(f"line {line} is longer than {limit} bytes")
        self.line = line
        self.limit = limit


class Stopped(Exception):
    """The program was stopped (:meth:`ChildProcess.stop`) while its output was read."""


class Timeout(Exception):
    """The program wrote nothing for the given number of seconds."""


class ChildProcess:
    """One run of a program: ``argv`` started at once, read line by line, stopped for sure.

    ``scrub`` masks credentials in the standard error tail before anyone sees it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        scrub: Callable[[str], str],
        max_line_bytes: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self._scrub = scrub
        self._max_line = max_line_bytes
        self._lines: queue.Queue[object] = queue.Queue(maxsize=QUEUE_LINES)
        # The lines of the read the consumer took last, not yet returned (its thread's own).
        self._pending: deque[bytes] = deque()
        # Bytes of the lines in the queue: 256 records of 50 MB would be 12.5 GB.
        self._ahead = 0
        self._room = threading.Condition()
        self._stopping = threading.Event()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._tail_lock = threading.Lock()
        self._reaped = False
        self.returncode: int | None = None
        self.proc = spawn(argv, env)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._out = threading.Thread(
            target=self._read_stdout, args=(self.proc.stdout,), name="child-stdout", daemon=True
        )
        self._err = threading.Thread(
            target=self._read_stderr, args=(self.proc.stderr,), name="child-stderr", daemon=True
        )
        self._out.start()
        self._err.start()

    @property
    def pid(self) -> int:
        """The program's process id (also its process group id)."""
        return self.proc.pid

    # -- reader threads -----------------------------------------------------------------

    def _put(self, item: object) -> bool:
        while not self._stopping.is_set():
            try:
                self._lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _reserve(self, size: int) -> bool:
        """Wait until a line of ``size`` bytes fits the read-ahead (it always fits alone)."""
        with self._room:
            while self._ahead and self._ahead + size > QUEUE_BYTES:
                if self._stopping.is_set():
                    return False
                self._room.wait(0.1)
            self._ahead += size
        return True

    def _release(self, size: int) -> None:
        with self._room:
            self._ahead = max(0, self._ahead - size)
            self._room.notify_all()

    def _read_stdout(self, pipe: IO[bytes]) -> None:
        """Hand the consumer the lines each read completes, in order, each with its end."""
        number, started, held = 0, list[bytes](), 0
        try:
            while chunk := os.read(pipe.fileno(), READ_BYTES):
                *ended, rest = chunk.split(b"\n")
                lines = [line + b"\n" for line in ended]
                if lines:  # (the first ends the line earlier reads started)
                    lines[0] = b"".join([*started, lines[0]])
                    started, held = [], 0
                if rest:
                    started.append(rest)
                    held += len(rest)
                # (a line's size without its end)
                cut = next((n for n, ln in enumerate(lines) if len(ln) - 1 > self._max_line), None)
                if cut is not None or held > self._max_line:
                    cut = len(lines) if cut is None else cut
                    if not cut or self._hand(lines[:cut]):
                        self._put(LineTooLong(number + cut + 1, self._max_line))
                    return
                number += len(lines)
                if lines and not self._hand(lines):
                    return
            if started and not self._hand([b"".join(started)]):  # (a last line without its end)
                return
        except (OSError, ValueError) as exc:  # the pipe closed under us: stop() ran
            self._put(exc)
            return
        self._put(_EOF)

    def _hand(self, lines: list[bytes]) -> bool:
        """Queue ``lines`` once their bytes fit the read-ahead; False if stopped meanwhile."""
        size = sum(map(len, lines))
        return self._reserve(size) and self._put((lines, size))

    def _read_stderr(self, pipe: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                chunk = os.read(pipe.fileno(), 64 * 1024)
                if not chunk:
                    return
                self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        with self._tail_lock:
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            while self._tail_bytes - len(self._tail[0]) >= _TAIL_HELD:
                self._tail_bytes -= len(self._tail.popleft())

    def log(self, text: str) -> None:
        """Add one log line the program wrote as a message (not on standard error) to the tail."""
        # Masked before it is cut: a secret cut in two is no longer found.
        line = self._scrub(text.rstrip("\n")).encode("utf-8", errors="replace")
        self._keep(line[-STDERR_TAIL_BYTES:] + b"\n")

    def scrub(self, text: str) -> str:
        """``text`` with the program's credentials masked (as its log tail is)."""
        return self._scrub(text)

    # -- consuming --------------------------------------------------------------------

    def next_line(self, timeout: float | None) -> bytes | None:
        """The next line of standard output; None at its end.

        Raises :class:`Timeout` when the program wrote nothing for ``timeout``
        seconds, :class:`LineTooLong` for a line beyond the limit.
        """
        if self._pending:
            return self._pending.popleft()
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise Timeout(timeout) from None
        if item is _EOF:
            return None
        if item is _STOPPED:
            raise Stopped()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, tuple)
        lines, size = item
        self._release(size)
        self._pending.extend(lines)
        return self._pending.popleft()

    def stderr_tail(self) -> str:
        """The last few KiB of the program's log, decoded and scrubbed."""
        self._err.join(timeout=1.0)
        with self._tail_lock:
            data = b"".join(self._tail)
        # Masked whole, then cut: a secret the cut would halve is masked first.
        text = self._scrub(data.decode("utf-8", errors="replace").strip())
        if len(text) <= STDERR_TAIL_BYTES:
            return text
        text = text[-STDERR_TAIL_BYTES:]
        # Start at a line when one starts in the tail; else show the long last line's end.
        start = text.find("\n") + 1
        return "..." + (text[start:] if start else text)

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for the program to exit on its own, then end its group; None if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            if self._exited():
                self._finish_group()
                return self.returncode
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _exited(self) -> bool:
        # Peek without reaping: while the leader is a zombie its pid (the group id)
        # cannot be reused, so the group can still be signalled safely.
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _finish_group(self) -> None:
        # Any helper the program left behind goes with it: no orphan outlives a read.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if not self._reaped:
            self.returncode = self.proc.wait()
            self._reaped = True
        self._stopping.set()
        for thread, pipe in ((self._out, self.proc.stdout), (self._err, self.proc.stderr)):
            thread.join(timeout=2.0)
            # A pipe still held open by a process outside the group keeps its reader
            # blocked; closing it under that reader would block too: leave it be.
            if pipe is not None and not thread.is_alive():
                with contextlib.suppress(OSError):
                    pipe.close()
        # Wake a consumer waiting for a line: nothing more will come.
        self._pending.clear()
        with contextlib.suppress(queue.Empty):
            while True:
                self._lines.get_nowait()
        self._release(self._ahead)
        self._lines.put_nowait(_STOPPED)

    def stop(self) -> None:
        """End the program and its whole process group (SIGTERM, then SIGKILL) and reap it."""
        if self._reaped:
            return
        if not self._exited():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while not self._exited() and time.monotonic() < deadline:
                time.sleep(0.02)
        self._finish_group()
