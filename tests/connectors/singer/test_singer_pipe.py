"""A program's standard output read a whole read at a time, handed over line by line.

The lines a read completes go to the consumer together; a line cut between
reads waits for its end. Each line comes back whole, in order, with its
``\\n``; the line past ``max_line_bytes`` is named by its number, however
the reads cut it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from combined.connectors._subprocess._process import ChildProcess, LineTooLong
from combined.connectors._subprocess._rows import DECODER, decode_line


def _program(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "program.py"
    script.write_text("import sys, time\nout = sys.stdout.buffer\n" + body)
    return [sys.executable, str(script)]


def _lines(proc: ChildProcess) -> list[bytes]:
    lines = []
    while (line := proc.next_line(30)) is not None:
        lines.append(line)
    return lines


def test_a_line_written_in_pieces_comes_back_whole_and_in_order(tmp_path: Path) -> None:
    body = (
        "out.write(b'first\\nsec'); out.flush(); time.sleep(0.1)\n"
        "out.write(b'o'); out.flush(); time.sleep(0.1)\n"
        "out.write(b'nd\\n' + b''.join(b'%d\\n' % i for i in range(100000))); out.flush()\n"
        "time.sleep(0.1); out.write(b'no end'); out.flush()\n"
    )
    proc = ChildProcess(_program(tmp_path, body), scrub=str, max_line_bytes=1024)
    try:
        lines = _lines(proc)
    finally:
        proc.stop()
    numbers = [b"%d\n" % i for i in range(100000)]
    assert lines == [b"first\n", b"second\n", *numbers, b"no end"]


@pytest.mark.parametrize("pieces", [1, 4], ids=["one write", "four writes"])
def test_the_line_past_the_limit_is_named_by_its_number(tmp_path: Path, pieces: int) -> None:
    """Lines of exactly 100 bytes pass; the sixth, of 101, stops the read after the fifth."""
    long = "b'y' * 101 + b'\\n'"
    writes = "".join(
        f"out.write(({long})[{n * 26}:{(n + 1) * 26 if n < pieces - 1 else 200}]); "
        "out.flush(); time.sleep(0.05)\n"
        for n in range(pieces)
    )
    body = "out.write(b''.join([b'x' * 100 + b'\\n'] * 5)); out.flush()\n" + writes
    body += "out.write(b'after\\n'); out.flush()\n"
    proc = ChildProcess(_program(tmp_path, body), scrub=str, max_line_bytes=100)
    try:
        got = []
        with pytest.raises(LineTooLong) as info:
            while (line := proc.next_line(30)) is not None:
                got.append(line)
    finally:
        proc.stop()
    assert got == [b"x" * 100 + b"\n"] * 5
    assert info.value.line == 6


def test_a_line_growing_past_the_limit_without_an_end_stops_the_read(tmp_path: Path) -> None:
    """Never held whole: past the limit, the read stops while the line is still being written."""
    body = (
        "out.write(b'ok\\n'); out.flush()\nwhile True:\n    out.write(b'z' * 65536); out.flush()\n"
    )
    proc = ChildProcess(_program(tmp_path, body), scrub=str, max_line_bytes=1 << 20)
    try:
        assert proc.next_line(30) == b"ok\n"
        with pytest.raises(LineTooLong) as info:
            proc.next_line(30)
    finally:
        proc.stop()
    assert info.value.line == 2


def test_handing_lines_over_costs_far_less_than_decoding_them(tmp_path: Path) -> None:
    """300,000 short messages: their hand-off between threads under half their JSON decoding.

    One queue hand-off a line (a lock, a condition, a wake-up) cost as much
    CPU as decoding the line (1.1 against 1.0 CPU-s); a read's lines go over
    together now (0.14).
    """
    line = '{"type": "RECORD", "stream": "s", "record": {"id": 1, "v": "abc"}}\n'
    body = f"out.write({line.encode()!r} * 300000); out.flush()\n"
    started = time.process_time()
    proc = ChildProcess(_program(tmp_path, body), scrub=str, max_line_bytes=1024)
    lines = _lines(proc)
    proc.wait_exit(30)
    handed = time.process_time() - started
    started = time.process_time()
    for raw in lines:
        DECODER.decode(raw.decode("utf-8"))
    decoded = time.process_time() - started
    assert len(lines) == 300000
    assert handed < 0.5 * decoded, f"hand-off {handed:.2f} CPU-s, decoding {decoded:.2f}"


LINES = [
    b'{"type": "RECORD", "stream": "s", "record": {"id": 1, "total": 12.50, "n": 1e400}}\n',
    b'  \t{"type": "STATE", "value": {}}  \r\n',
    '\u00a0{"a": "\u00e9"}\u00a0\n'.encode(),
    b"[1, 2] \n",
    b'"just text"',
    b'{"type": "RECORD"} {"extra": 1}\n',
    b'{"type": "RECORD", \n',
    b"not json\n",
    b"\n",
    b'{"a": NaN, "a": 2}\n',
    b'{"bad": "\xff"}\n',
]


@pytest.mark.parametrize("raw", LINES, ids=range(len(LINES)))
def test_a_line_decodes_as_the_decoder_reads_its_stripped_text(raw: bytes) -> None:
    """The same value, or the same error (message and column), as ``DECODER.decode``."""

    def outcome(decode: Callable[[bytes], Any]) -> Any:
        try:
            return ("value", decode(raw))
        except UnicodeDecodeError as exc:
            return ("not utf-8", exc.start)
        except json.JSONDecodeError as exc:
            return ("not json", exc.msg, exc.colno)

    assert outcome(decode_line) == outcome(lambda r: DECODER.decode(r.decode("utf-8").strip()))
