"""The benchmark harness's own logic: measurement helpers, planning, the report, a tiny run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `bench` lives at the repository root, next to `src`
    sys.path.insert(0, str(REPO))

from bench import case, measure, report, run, workload  # noqa: E402

MB = 1024 * 1024


# -- measurement helpers -----------------------------------------------------------------------


def test_read_status_of_this_process() -> None:
    status = measure.read_status(os.getpid())
    assert status["VmRSS"] > 0 and status["VmHWM"] >= status["VmRSS"]
    assert measure.read_status(2**22 + 12345) == {}  # no such process


def _fake_proc(root: Path, procs: dict[int, tuple[str, int]]) -> Path:
    for pid, (comm, ppid) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
    (root / "self").mkdir()
    return root


def _write_stat(
    root: Path,
    pid: int,
    ppid: int,
    times: tuple[int, int, int, int],
    *,
    comm: str = "postgres",
    start: int | None = None,
) -> None:
    """A ``/proc/<pid>/stat`` line: (utime, stime, cutime, cstime) ticks, a start time."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = " ".join(["0"] * 9)  # pgrp ... cmajflt
    ut, st, cut, cst = times
    since = pid * 10 if start is None else start
    tail = f"20 0 1 0 {since}"  # priority nice threads itrealvalue starttime
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {rest} {ut} {st} {cut} {cst} {tail}\n")


def _server_seconds(proc: Path) -> float:
    reading = measure.server_cpu(proc=proc)
    assert reading is not None
    return reading.seconds


def test_server_cpu_counts_live_processes_and_the_postmasters_reaped_children(
    tmp_path: Path,
) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    # not the server: ignored, reaped time too
    _write_stat(tmp_path, 1, 0, (5, 5, 900, 900), comm="init")
    _write_stat(tmp_path, 100, 1, (10, 20, 300, 70))  # the postmaster: own + exited backends
    _write_stat(tmp_path, 101, 100, (40, 10, 7, 7))  # a live backend: its own time only
    _write_stat(tmp_path, 102, 100, (2, 3, 0, 0))
    _write_stat(tmp_path, 200, 1, (1000, 1000, 0, 0), comm="python")
    (tmp_path / "self").mkdir()
    want = (10 + 20 + 300 + 70 + 40 + 10 + 2 + 3) / ticks
    assert _server_seconds(tmp_path) == pytest.approx(want)
    reading = measure.server_cpu(proc=tmp_path)
    assert reading is not None and reading.postmasters == {(100, 1000)}
    # No such server visible (another host): no figure, rather than a zero.
    assert measure.server_cpu("mariadbd", proc=tmp_path) is None
    assert measure.server_cpu(proc=tmp_path / "missing") is None


def test_a_backend_reaped_while_the_server_is_read_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    _write_stat(tmp_path, 100, 1, (10, 0, 0, 0))  # the postmaster
    _write_stat(tmp_path, 101, 100, (50, 0, 0, 0))  # a backend about to exit
    real = measure._named_stats
    calls = []

    def scan(name: str, proc: Path) -> Any:
        calls.append(1)
        if len(calls) == 2:
            # The second scan reads the postmaster, then the backend is reaped
            # before its own entry is read: a torn reading (its 50 ticks lost).
            torn = real(name, proc)
            assert torn is not None
            torn.pop(101)
            _write_stat(tmp_path, 100, 1, (10, 0, 50, 0))
            (tmp_path / "101" / "stat").unlink()
            return torn
        return real(name, proc)

    monkeypatch.setattr(measure, "_named_stats", scan)
    # The postmaster's reaped time moved across the torn scan: it is read again.
    assert _server_seconds(tmp_path) == pytest.approx(60 / ticks)
    assert len(calls) == 3


def test_a_server_that_never_holds_still_or_restarted_gives_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reaped = [0]

    def write(start: int) -> None:
        _write_stat(tmp_path, 100, 1, (5, 0, reaped[0], 0), start=start)

    write(7)
    real = measure._named_stats

    def busy(name: str, proc: Path) -> Any:
        reaped[0] += 3  # a backend reaped during every scan
        write(7)
        return real(name, proc)

    monkeypatch.setattr(measure, "_named_stats", busy)
    assert measure.server_cpu(proc=tmp_path) is None  # never held still: no figure
    monkeypatch.setattr(measure, "_named_stats", real)
    first = measure.server_cpu(proc=tmp_path)
    assert first is not None
    reaped[0] += 50
    write(7)
    later = measure.server_cpu(proc=tmp_path)
    assert later is not None and later.since(first) == pytest.approx(50 / os.sysconf("SC_CLK_TCK"))
    reaped[0] = 0
    write(9)  # the postmaster restarted: its reaped time started again
    restarted = measure.server_cpu(proc=tmp_path)
    assert restarted is not None and restarted.since(later) is None
    assert later.since(None) is None


@pytest.mark.postgres
def test_the_server_cpu_of_a_connection_just_closed_is_counted(pg_server_dsn: str) -> None:
    import psycopg

    postmaster = measure.postmaster_of(pg_server_dsn)
    assert postmaster is not None
    for _ in range(3):
        before = measure.server_cpu(postmaster=postmaster)
        assert before is not None and before.postmasters == {
            (postmaster, int(Path(f"/proc/{postmaster}/stat").read_text().split()[21]))
        }
        with psycopg.connect(pg_server_dsn) as conn:
            conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        end = measure.server_cpu(postmaster=postmaster)  # at once: the backend may be exiting
        assert end is not None
        spent = end.since(before)
        assert spent is not None and spent >= 0.1, (before, end)


def test_only_the_dsns_server_counts_when_another_cluster_starts_beside_it(
    tmp_path: Path,
) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    _write_stat(tmp_path, 100, 1, (10, 0, 30, 0))  # the DSN's postmaster
    _write_stat(tmp_path, 101, 100, (5, 0, 0, 0))  # its backend
    first = measure.server_cpu(postmaster=100, proc=tmp_path)
    # Another cluster (a test's initdb) starts: it is not this server.
    _write_stat(tmp_path, 300, 1, (70, 0, 0, 0))
    _write_stat(tmp_path, 301, 300, (9, 0, 0, 0))
    _write_stat(tmp_path, 101, 100, (25, 0, 0, 0))
    later = measure.server_cpu(postmaster=100, proc=tmp_path)
    assert first is not None and later is not None
    assert later.since(first) == pytest.approx(20 / ticks)
    # Every postgres on the host: the two readings compare nothing.
    assert measure.server_cpu(proc=tmp_path).since(first) is None  # type: ignore[union-attr]
    # The postmaster gone (restarted under another pid): no figure.
    assert measure.server_cpu(postmaster=555, proc=tmp_path) is None


def test_tree_follows_descendants_only(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        {
            1: ("init", 0),
            10: ("python", 1),
            11: ("odd) name (x", 10),  # comm may hold spaces and parentheses
            12: ("grand child", 11),
            20: ("other", 1),
        },
    )
    parents = measure.parent_map(proc)
    assert parents == {1: 0, 10: 1, 11: 10, 12: 11, 20: 1}
    assert sorted(measure.tree(10, parents)) == [10, 11, 12]
    assert measure.tree(12, parents) == [12]


def test_sampler_sees_a_grandchild_allocation() -> None:
    # The child starts a grandchild that holds ~120 MB while the child holds ~60 MB.
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        grand = subprocess.Popen([sys.executable, "-c",
            "import time; b = bytearray(120 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(1.0)"])
        a = bytearray(60 * 2**20); a[::4096] = b'y' * len(a[::4096])
        grand.wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = measure.TreeSampler(proc.pid, interval_s=0.02).start()
    proc.wait()
    peak = sampler.stop()
    assert proc.returncode == 0
    assert peak.processes >= 2 and peak.samples > 5
    assert peak.max_hwm >= 120 * MB  # the grandchild's own high-water mark
    assert peak.tree_rss >= 170 * MB  # both held at once
    assert peak.peak == max(peak.tree_rss, peak.max_hwm)


def test_own_peak_rss_counts_children() -> None:
    subprocess.run(
        [sys.executable, "-c", "b = bytearray(50 * 2**20); b[::4096] = b'z' * len(b[::4096])"],
        check=True,
    )
    own = measure.own_peak_rss()
    assert own["self_hwm"] > 0
    assert own["children_maxrss"] >= 50 * MB


def test_written_counts_new_and_changed_files(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert measure.snapshot_dir(lake) == {}
    (lake / "t" / "_delta_log").mkdir(parents=True)
    (lake / "t" / "old.parquet").write_bytes(b"x" * 100)
    (lake / "t" / "gone.parquet").write_bytes(b"x" * 50)
    (lake / "t" / "_delta_log" / "0.json").write_bytes(b"{}")
    before = measure.snapshot_dir(lake)
    (lake / "t" / "gone.parquet").unlink()
    (lake / "t" / "new.parquet").write_bytes(b"y" * 300)
    (lake / "t" / "_delta_log" / "1.json").write_bytes(b"{" * 10)
    (lake / "t" / "_delta_log" / "00.checkpoint.parquet").write_bytes(b"c" * 7)
    after = measure.snapshot_dir(lake)
    w = measure.written(before, after)
    assert w.files == 3 and w.bytes == 317
    assert (w.data_files, w.data_bytes) == (1, 300)  # the checkpoint is not a data file
    assert w.net_bytes == 317 - 50
    assert measure.written(after, after).as_dict() == {
        "bytes": 0,
        "files": 0,
        "data_files": 0,
        "data_bytes": 0,
        "net_bytes": 0,
        "linked_bytes": 0,
    }


def test_a_hard_link_is_written_once(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    (lake / "_deliveries").mkdir(parents=True)
    (lake / "t").mkdir()
    before = measure.snapshot_dir(lake)
    (lake / "_deliveries" / "d1.parquet").write_bytes(b"d" * 400)
    os.link(lake / "_deliveries" / "d1.parquet", lake / "t" / "part-1.parquet")
    (lake / "t" / "part-2.parquet").write_bytes(b"p" * 30)
    w = measure.written(before, measure.snapshot_dir(lake))
    assert (w.bytes, w.files, w.data_files, w.linked_bytes) == (430, 2, 2, 400)
    # A link to a file that was there before writes nothing either.
    again = measure.snapshot_dir(lake)
    os.link(lake / "t" / "part-2.parquet", lake / "t" / "part-3.parquet")
    w = measure.written(again, measure.snapshot_dir(lake))
    assert (w.bytes, w.linked_bytes) == (0, 30)


# -- planning ----------------------------------------------------------------------------------


def test_select_accepts_names_numbers_and_all() -> None:
    assert run.select(["3", "floor"]) == ["floor", "snapshot_initial"]
    assert run.select(["all"]) == list(run.CASES)
    assert run.select(["8,1"]) == ["floor", "scale"]
    with pytest.raises(SystemExit):
        run.select(["nine"])


def test_plan_adds_the_setup_a_case_needs() -> None:
    steps = run.plan(["snapshot_changed"], [])
    names = [(s.kind, s.name) for s in steps]
    assert names == [
        ("db", "create"),
        ("setup", "warmup"),
        ("setup", "snapshot_initial"),
        ("db", "mutate"),
        ("case", "snapshot_changed"),
    ]
    steps = run.plan(["dlt_merge", "cursor_append"], [])
    names = [(s.kind, s.name) for s in steps]
    assert names.index(("setup", "dlt_merge_initial")) < names.index(("db", "mutate"))
    assert names.index(("db", "mutate")) < names.index(("case", "dlt_merge"))
    assert names[-3:] == [("setup", "cursor_initial"), ("db", "append"), ("case", "cursor_append")]
    # the initial snapshot, when measured, is the baseline: no extra setup
    steps = run.plan(run.select(["all"]), [100, 400])
    assert ("setup", "snapshot_initial") not in [(s.kind, s.name) for s in steps]
    assert [(s.name, s.arg) for s in steps if s.name.startswith("scale_")] == [
        ("scale_100", 100),
        ("scale_400", 400),
    ]
    assert [s.kind for s in run.plan(["scale"], [5])] == ["db", "case"]
    # the partitioned snapshot reads the pristine table, before any change
    names = [(s.kind, s.name) for s in steps]
    assert names.index(("case", "partitioned")) < names.index(("db", "mutate"))
    # so do the S3 lake and its local twin (case 10)
    assert names.index(("case", "s3")) < names.index(("db", "mutate"))
    assert run.select(["10"]) == ["s3"]
    # every row is updated after the 1% change, and re-captured from that baseline alone
    assert names.index(("case", "snapshot_changed")) < names.index(("db", "update_all"))
    assert names.index(("db", "update_all")) + 1 == names.index(("case", "snapshot_rewritten"))
    assert names.index(("case", "snapshot_rewritten")) < names.index(("db", "append"))
    steps = run.plan(run.select(["11"]), [])
    assert [(s.kind, s.name) for s in steps] == [
        ("db", "create"),
        ("setup", "warmup"),
        ("setup", "snapshot_initial"),
        ("db", "update_all"),
        ("case", "snapshot_rewritten"),
    ]


def test_a_reused_workdir_starts_from_nothing(tmp_path: Path) -> None:
    for name in ("combined/lake", "scale_1000/lake", "logs", "mine"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("kept")
    run.clean_workdir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "notes.txt"]


def test_project_file_loads(tmp_path: Path) -> None:
    from combined.config import load_project

    path = run.write_project(tmp_path, "host=127.0.0.1 dbname=x user=postgres", "orders", "256MiB")
    project = load_project(path)
    assert project.reduction_memory == 256 * MB
    assert project.dataset("pg", "orders_cursor").strategy == "cursor"


def test_dlt_unavailable_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dlt", None)  # import dlt -> ImportError
    reason = case.dlt_unavailable()
    assert reason is not None and reason.startswith("dlt cannot be imported")
    res = report.from_child(
        "dlt_replace",
        "2",
        "dlt",
        {"op": "dlt_replace", "unavailable": reason},
        peak_rss=0,
        process_seconds=0.1,
    )
    assert res.status == f"unavailable: {reason}"
    row = report.table([res]).splitlines()[-1]
    assert "unavailable: dlt cannot be imported" in row


# -- the report --------------------------------------------------------------------------------


def _res(
    key: str, seconds: float, rss: int, lake: int = 0, files: int = 0, **kw: object
) -> report.CaseResult:
    r = report.CaseResult(key=key, label=key[:3], title=key, seconds=seconds, rows=1000)
    r.peak_rss, r.lake_bytes, r.data_files = rss, lake, files
    r.extra = dict(kw)
    return r


def test_table_and_targets_from_synthetic_results() -> None:
    results = [
        _res("floor", 10.0, 100 * MB, 1000),
        _res("dlt_replace", 40.0, 800 * MB, 2000),
        _res("snapshot_initial", 12.0, 300 * MB, 10_000, 4),
        _res("snapshot_unchanged", 16.0, 300 * MB, 0, 0),
        _res(
            "snapshot_changed",
            15.0,
            350 * MB,
            200,
            4,
            details={"stats": {"orders": {"inserts": 5, "updates": 10, "deletes": 1}}},
        ),
        _res("scale_100", 5.0, 300 * MB),
        _res("scale_400", 9.0, 390 * MB),
    ]
    text = report.table(results)
    lines = text.splitlines()
    assert lines[0] == report.HEADER and lines[1] == report.SEPARATOR
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    initial = next(line for line in lines if "| snapshot_initial |" in line)
    assert "| 1.20x | 3.33x |" in initial  # vs floor, speed-up vs dlt
    scale = next(line for line in lines if "| scale_400 |" in line)
    assert "| - | - |" in scale  # scale cases read other tables: no floor ratio
    status = {t.goal: t.status for t in report.targets(results, table_rows=1000)}
    assert status["initial snapshot within 1.3x of the floor"] == "met"
    assert status["initial snapshot at least 3x faster than dlt"] == "met"
    assert status["peak RSS under 400 MB"] == "met"
    assert status["peak RSS flat: 1,000-row peak / 1,000-row peak <= 1.2"] == "missed"  # 1.3
    assert status["unchanged re-capture within 1.5x of the floor"] == "missed"
    assert status["unchanged re-capture writes no lake data files"] == "met"
    assert status["1%-changed re-capture within 1.6x of the floor"] == "met"
    # 16 changed rows of 1000 (1.6%): 200 of 10,000 bytes (2%) is proportional
    assert status["1%-changed re-capture writes lake bytes proportional to the change"] == "met"
    partitioned = "partitioned snapshot with 2 workers faster than the single-stream floor"
    assert status[partitioned] == "not measured"
    fast = _res("partitioned", 8.0, 300 * MB, details={"partitions": 2, "phases": []})
    assert {t.goal: t.status for t in report.targets([*results, fast])}[partitioned] == "met"
    md = report.targets_table(report.targets(results))
    assert md.splitlines()[0] == "| target | status | evidence |"


def test_the_cpu_bound_counts_the_servers_cpu_on_the_same_cores() -> None:
    floor = _res("floor", 4.0, 100 * MB)
    case = _res("snapshot_initial", 6.0, 300 * MB)
    assert report.cpu_bound(case) is None  # no CPU figures: no bound
    case.cpu_seconds, case.server_cpu_seconds = 9.0, 1.0
    assert report.cpu_bound(case, cores=2) == pytest.approx(5.0)
    floor.cpu_seconds = 4.0
    (first,) = [t for t in report.targets([floor, case]) if t.goal.startswith("initial snapshot w")]
    cores = os.cpu_count() or 1
    bound = 10.0 / cores
    assert f"CPU bound: (client 9.00 + server 1.00 CPU-s) / {cores} cores = {bound:.2f} s" in (
        first.evidence
    )
    assert f"= {bound / 4.0:.2f}x the floor" in first.evidence


def test_failed_case_row_and_missing_floor() -> None:
    bad = report.from_child(
        "snapshot_initial", "3", "x", None, peak_rss=0, process_seconds=1.0, failure="exit 1: boom"
    )
    assert bad.status == "failed: exit 1: boom" and not bad.ok
    assert "failed: exit 1: boom" in report.table([bad])
    first = report.targets([bad])[0]
    assert first.status == "not measured"


# -- a tiny run against a real PostgreSQL --------------------------------------------------------


def _rows_of(markdown: str, header: str) -> list[list[str]]:
    lines = markdown.splitlines()
    start = lines.index(header)
    out = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def _tiny(tmp_path: Path, pg_server_dsn: str, cases: list[str], *extra: str) -> str:
    database = f"combined_bench_test_{uuid.uuid4().hex[:8]}"
    return run.main(
        [
            "--rows",
            "2000",
            "--cases",
            *cases,
            "--dsn",
            pg_server_dsn,
            "--database",
            database,
            "--drop-database",
            "--workdir",
            str(tmp_path / "work"),
            *extra,
        ]
    )


@pytest.mark.postgres
def test_tiny_run_prints_a_well_formed_table(
    tmp_path: Path, pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[str] = []
    spawn = run.spawn

    def counted(ctx: Any, name: str, *args: Any) -> Any:
        spawned.append(name)
        return spawn(ctx, name, *args)

    synced: list[int] = []
    monkeypatch.setattr(os, "sync", lambda: synced.append(1))
    monkeypatch.setattr(run, "spawn", counted)
    text = _tiny(tmp_path, pg_server_dsn, ["floor", "snapshot_initial", "snapshot_unchanged"])
    # Every case starts with the page cache's dirty data of the ones before flushed.
    assert len(synced) == len(spawned) >= 3
    rows = _rows_of(text, report.HEADER)
    assert [r[0] for r in rows] == ["1", "3", "4"]
    columns = report.HEADER.count("|") - 1
    for r in rows:
        assert len(r) == columns
        assert r[2] == "2,000", r  # rows read
        assert float(r[3]) > 0 and float(r[4]) > 0 and r[7].endswith("MB")
        assert float(r[5]) >= 0  # the server's CPU (its clock ticks may round 2,000 rows to 0)
    floor, initial, unchanged = rows
    assert floor[10] == "1.00x" and initial[10].endswith("x")
    assert int(initial[9]) > 0 and unchanged[9] == "0"
    # An unchanged re-capture writes no data: only its publication and Run in the ledger.
    assert unchanged[8] == "0 B" or re.search(r"written: ledger [\d.]+ [KMG]?B(?!,)", unchanged[12])
    assert "+2,000 ~0 -0" in initial[12] and "+0 ~0 -0" in unchanged[12]
    phases = "Combined phases (wall time (CPU time of the capture process) / its peak RSS):"
    assert phases in text and " cpu) / " in text
    assert "| unchanged re-capture writes no lake data files | **met** |" in text
    assert (tmp_path / "work" / "results.json").exists()


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.beside  # (a minute of fresh processes: beside the parallel suite)
def test_tiny_run_of_every_case(tmp_path: Path, pg_server_dsn: str) -> None:
    text = _tiny(tmp_path, pg_server_dsn, ["all"], "--scale-rows", "1000,4000")
    rows = _rows_of(text, report.HEADER)
    labels = [r[0] for r in rows]
    assert labels == [
        *["1", "2", "3", "4", "5", "6", "7", "8 (1k)", "8 (4k)", "9"],
        *["10 (local)", "10 (S3)", "11"],
    ]
    by_label = {r[0]: r for r in rows}
    for label in ("1", "3", "4", "5", "7", "8 (1k)", "8 (4k)", "9", "10 (local)", "10 (S3)"):
        assert by_label[label][3] != "-", by_label[label]
    # the S3 lake and the local one each hold the source; the upload is counted
    for label in ("10 (local)", "10 (S3)"):
        assert "lake = source (2,000 rows" in by_label[label][12], by_label[label]
    assert "counted at a relay" in by_label["10 (S3)"][12]
    held = by_label["10 (S3)"][12].split("the bucket holds: ")[1]
    assert "raw " in held and "table " in held and "usage " in held
    assert "+10 ~20 -2" in by_label["5"][12]
    assert "+2,000 ~0 -0" in by_label["9"][12]
    assert "projection 2,008 rows = source 2,008" in by_label["5"][12]
    assert "+0 ~2,008 -0" in by_label["11"][12]  # every row updated: all changed, none lost
    assert "projection 2,008 rows = source 2,008" in by_label["11"][12]
    for label in ("2", "6"):  # dlt is optional: measured, or reported as unavailable
        cell = by_label[label]
        assert cell[3] != "-" or cell[12].startswith("unavailable:"), cell
    if by_label["6"][3] != "-":
        assert "keeps 2 rows the source deleted (of 2 deleted)" in by_label["6"][12]
    assert "Memory scaling: peak RSS" in text


@pytest.mark.postgres
@pytest.mark.parametrize("shape", ["narrow", "wide"])
def test_tiny_run_of_a_table_shape_lands_the_source_in_the_lake(
    tmp_path: Path, pg_server_dsn: str, shape: str
) -> None:
    text = _tiny(
        tmp_path,
        pg_server_dsn,
        ["floor", "snapshot_initial", "snapshot_unchanged", "snapshot_changed"],
        "--shape",
        shape,
    )
    rows = _rows_of(text, report.HEADER)
    by_label = {r[0]: r for r in rows}
    assert list(by_label) == ["1", "3", "4", "5"]
    for r in rows:
        assert r[3] != "-" and float(r[4]) > 0, r  # wall time and CPU seconds, side by side
    assert "+2,000 ~0 -0" in by_label["3"][12] and "+0 ~0 -0" in by_label["4"][12]
    assert "+10 ~20 -2" in by_label["5"][12]
    assert "projection 2,008 rows = source 2,008" in by_label["5"][12]
    assert f"table shape: {shape} ({shape}: id bigint PRIMARY KEY" in text


@pytest.mark.postgres
@pytest.mark.parametrize("shape", ["compkey", "parted"])
def test_a_shape_with_its_own_key_or_partitions_lands_the_source_in_the_lake(
    tmp_path: Path, pg_server_dsn: str, shape: str
) -> None:
    text = _tiny(
        tmp_path,
        pg_server_dsn,
        ["floor", "snapshot_initial", "snapshot_changed"],
        "--shape",
        shape,
    )
    by_label = {r[0]: r for r in _rows_of(text, report.HEADER)}
    assert list(by_label) == ["1", "3", "5"]
    assert "+2,000 ~0 -0" in by_label["3"][12]
    assert "+10 ~20 -2" in by_label["5"][12]
    assert "projection 2,008 rows = source 2,008" in by_label["5"][12]


def test_every_shape_has_its_full_size_and_an_update_that_bumps_the_cursor() -> None:
    headline = ("orders", "narrow", "wide")
    assert {n: workload.SHAPES[n].rows for n in headline} == {
        "orders": 2_000_000,
        "narrow": 5_000_000,
        "wide": 1_000_000,
    }
    # (every shape with the cursor's column bumps it; ``tiny`` has none)
    assert all("updated_at = now()" in s.update for s in workload.SHAPES.values() if s.index)
    assert [n for n, s in workload.SHAPES.items() if not s.index] == ["tiny"]
    assert run.parse(["--shape", "narrow"]).rows == 5_000_000
    assert run.parse(["--shape", "wide", "--rows", "300"]).rows == 300
