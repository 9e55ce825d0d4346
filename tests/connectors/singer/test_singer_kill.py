"""A Combined killed outright (SIGKILL) leaves no tap running and, after the next run, no files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.singer.fixtures import dead
from tests.connectors.singer.test_singer_lines import SCHEMA, out, read, record, rows

from combined.connectors._subprocess._private import current_owner, owner_of, sweep
from combined.connectors.abc import ReadRequest
from combined.connectors.singer import SingerSource
from combined.protocol import RecordBatchMessage

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal and /proc are Linux's"
)

Scripted = Callable[..., dict[str, Any]]

#: A Combined reading part way, then waiting to be killed: prints the tap's pid.
READER = """
import sys
import time
from combined.connectors.abc import ReadRequest
from combined.connectors.singer import SingerSource
source = SingerSource({config!r})
request = ReadRequest(dataset="s", relation="s", key=("id",), strategy="snapshot", batch_rows=1)
extraction = source.read(request)
messages = iter(extraction)
next(messages)
print(extraction.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def readers(
    tmp_path: Path,
) -> Iterator[Callable[[dict[str, Any]], tuple[subprocess.Popen[str], int]]]:
    """Start Combined processes reading part way, with ``tmp_path/tmp`` as TMPDIR; killed after."""
    private = tmp_path / "tmp"
    private.mkdir()
    started: list[tuple[subprocess.Popen[str], int]] = []

    def start(config: dict[str, Any]) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", READER.format(config=config)],
            env={**os.environ, "TMPDIR": str(private)},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        tap = int(proc.stdout.readline())
        started.append((proc, tap))
        return proc, tap

    yield start
    for proc, tap in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):  # a tap left by a failing test
            os.killpg(tap, signal.SIGKILL)


def test_a_tap_dies_with_a_combined_killed_outright(scripted: Scripted, readers: Any) -> None:
    reader, tap = readers(scripted([out(SCHEMA), record(1), record(2), {"sleep": 120}]))
    assert not dead(tap, within=0.2)
    reader.kill()  # no finally block, no atexit hook runs
    reader.wait()
    assert dead(tap)  # the kernel killed it: it did not sleep on as an orphan


def test_the_next_run_removes_the_files_of_a_combined_killed_outright_only(
    scripted: Scripted, readers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = scripted([out(SCHEMA), record(1), record(2), {"sleep": 120}])
    killed, _ = readers(config)
    alive, _ = readers(config)
    private = tmp_path / "tmp"
    owners = {owner_of(p.name).pid: p for p in private.iterdir()}  # type: ignore[union-attr]
    assert set(owners) == {killed.pid, alive.pid}
    assert (owners[killed.pid] / "config.json").stat().st_mode & 0o777 == 0o600
    killed.kill()
    killed.wait()
    assert owners[killed.pid].exists()  # a process killed outright cleans nothing up

    # The next run of any Combined process (this one) removes what the dead one left,
    # and nothing of the one still reading.
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    finished = scripted([out(SCHEMA), record(7)])
    assert rows(read(finished)) == [{"id": 7, "u": 7}]
    assert sorted(private.iterdir()) == [owners[alive.pid]]
    assert (owners[alive.pid] / "config.json").exists()


def test_a_tap_started_by_a_thread_that_ended_reads_on(scripted: Scripted) -> None:
    # The kernel's parent-death signal follows the *thread* that forked: a tap
    # started while a short-lived thread iterated must outlive that thread.
    config = scripted([out(SCHEMA), record(1), record(2), {"sleep": 1}, record(3)])
    request = ReadRequest(dataset="s", relation="s", key=("id",), strategy="snapshot", batch_rows=1)
    extraction = SingerSource(config).read(request)
    messages = iter(extraction)
    first: list[Any] = []
    opener = threading.Thread(target=lambda: first.append(next(messages)))
    opener.start()
    opener.join()
    try:
        pid = extraction.pid  # type: ignore[attr-defined]
        assert isinstance(first[0], RecordBatchMessage) and not dead(pid, within=0.5)
        rest = list(messages)  # on this thread, to the end
        got = [
            r["id"]
            for m in [*first, *rest]
            if isinstance(m, RecordBatchMessage)
            for r in m.batch.to_pylist()
        ]
        assert got == [1, 2, 3]
    finally:
        extraction.finish("abort")


def _proc_start(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[19])


def test_a_sweep_removes_only_directories_whose_owner_is_surely_dead(tmp_path: Path) -> None:
    me = current_owner()
    other_host = "0" * 8 if me.host != "0" * 8 else "1" * 8
    ended = subprocess.Popen(["true"])
    ended.wait()

    def make(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text("{}")
        return path

    kept = [
        make(f"combined-singer-{me.tag()}-mine0001"),  # this process
        make(f"combined-airbyte-1-{_proc_start(1)}-{me.host}-init0001"),  # alive: pid 1
        make(f"combined-singer-{ended.pid}-5-{other_host}-else0001"),  # another host or boot
        make("combined-singer-k3j4h5g6"),  # made before owners were recorded
    ]
    removed = [
        make(f"combined-singer-{me.pid}-{me.start + 1}-{me.host}-prev0001"),  # our pid, reused
        make(f"combined-airbyte-{ended.pid}-{me.start}-{me.host}-gone0001"),  # no such process
    ]
    (tmp_path / f"combined-singer-{ended.pid}-1-{me.host}-file0001").write_text("")  # a file
    link = tmp_path / f"combined-singer-{ended.pid}-1-{me.host}-link0001"
    link.symlink_to(kept[0])

    assert sorted(sweep(tmp_path)) == sorted(removed)
    assert all(p.is_dir() for p in kept) and not any(p.exists() for p in removed)
    assert link.is_symlink() and (tmp_path / link.name).exists()
    assert owner_of(kept[3].name) is None
