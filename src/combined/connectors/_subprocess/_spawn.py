"""Start a program that dies with Combined, even when Combined is killed outright.

On Linux the program is started through a tiny Python wrapper that asks the
kernel to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
then ``exec``s it: same pid, same argv in ``ps``, and the setting survives
the ``exec``. A wrapper rather than a ``preexec_fn``: running Python between
``fork`` and ``exec`` in a process with threads (reader threads, DuckDB,
Arrow) may deadlock the child. It costs one interpreter start-up (~10 ms).

The kernel's "parent" is the *thread* that forked, not the process: a
program forked by a thread that then ends would be killed with it. So every
program is forked by one thread that lives as long as the process
(:class:`_Spawner`), whichever thread starts the read.

The signal reaches the program itself, not processes it started (a fork
clears it): a program that starts helpers should end them when it ends.
Elsewhere (macOS) programs are started as they are, without it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeAlias

Popen: TypeAlias = subprocess.Popen[bytes]

#: Run by ``python -I -S -c`` with (report fd, parent pid, argv...): arms the
#: parent-death signal, then becomes the program. A failed exec reports its errno.
_WRAPPER = """\
import os, sys
report, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
if os.getppid() != parent:
    os._exit(137)  # the parent died before the signal was armed
os.set_inheritable(report, False)  # closed by a successful exec: nothing to report
try:
    os.execv(argv[0], argv)
except OSError as exc:
    os.write(report, str(exc.errno).encode())
    os._exit(127)
"""


def _wrapped() -> bool:
    """Whether programs are started through the parent-death wrapper here."""
    # A frozen application's executable is not a Python that runs ``-c``.
    return (
        sys.platform.startswith("linux")
        and bool(sys.executable)
        and os.access(sys.executable, os.X_OK)
        and not getattr(sys, "frozen", False)
    )


def _popen(args: list[str], env: dict[str, str] | None, keep: tuple[int, ...] = ()) -> Popen:
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        pass_fds=keep,
    )


def _start(argv: Sequence[str], env: dict[str, str] | None) -> Popen:
    if not _wrapped():
        return _popen(list(argv), env)
    read, write = os.pipe()
    try:
        wrapper = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(write), str(os.getpid())]
        proc = _popen([*wrapper, *argv], env, (write,))
        os.close(write)
        write = -1
        report = b""
        while chunk := os.read(read, 64):
            report += chunk
    finally:
        os.close(read)
        if write != -1:
            os.close(write)
    if report:
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        code = int(report)
        raise OSError(code, os.strerror(code), argv[0])
    return proc


class _Spawner:
    """The one thread that forks every program, alive as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] | None = None
        self._pid = 0

    def forget(self) -> None:
        """In a forked child: the thread and its lock stayed with the parent."""
        self._lock = threading.Lock()
        self._jobs = None

    def _queue(self) -> queue.SimpleQueue[tuple[Callable[[], object], Future[object]]]:
        with self._lock:
            if self._jobs is None or self._pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(
                    target=self._serve, args=(self._jobs,), name="combined-spawner", daemon=True
                ).start()
            return self._jobs

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]]) -> None:
        # Blocks in get() between jobs, never returns: a daemon thread left
        # waiting at interpreter exit stays until the process ends.
        while True:
            job, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def popen(self, argv: Sequence[str], env: dict[str, str] | None) -> Popen:
        """Start ``argv`` on the spawner thread; raises ``OSError`` when it cannot start."""
        future: Future[object] = Future()
        self._queue().put((lambda: _start(argv, env), future))
        try:
            proc = future.result()
        except BaseException:
            # Interrupted (SIGTERM, Ctrl-C) while the program started: once it
            # has, nobody owns it, so it ends at once.
            future.add_done_callback(_kill_started)
            raise
        assert isinstance(proc, subprocess.Popen)
        return proc


def _kill_started(future: Future[object]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    proc = future.result()
    assert isinstance(proc, subprocess.Popen)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


_SPAWNER = _Spawner()
os.register_at_fork(after_in_child=_SPAWNER.forget)


def spawn(argv: Sequence[str], env: dict[str, str] | None) -> Popen:
    """Start ``argv`` in a new session, pipes on standard output and error, to die with us.

    Raises ``OSError`` when the program cannot be started.
    """
    return _SPAWNER.popen(argv, env)
