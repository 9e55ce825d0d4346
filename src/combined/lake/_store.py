"""Where the lake's bytes live: a local directory or an object store.

A :class:`LakeStore` names the lake's root as a local path or an
``s3://``, ``gs://`` or ``az://`` URL. Locations inside it are strings (a
path, or a URL under the root's). Delta tables are opened by delta-rs with
:meth:`LakeStore.storage_options`; other lake files (the raw layer,
quarantine) go through a :class:`pyarrow.fs.FileSystem`; DuckDB reads remote
files through Arrow datasets (it fetches no extension). Credentials come
from the store's usual environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``),
never from combined.yaml.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    import pyarrow.fs as pafs

#: How many times Arrow's S3 filesystem tries a request (delta-rs: 1 + 10 retries),
#: unless ``AWS_MAX_ATTEMPTS`` (the AWS SDKs' own variable) says otherwise.
S3_ATTEMPTS = 11

#: Tries of a probe's requests (:attr:`LakeStore.probe_fs`): a burst of 503 SlowDown
#: past them fails a capture's start, which its retries take again, never a write.
PROBE_ATTEMPTS = 3

#: delta-rs' bounds on each request of a table of small records (the lake's ledger): a
#: store that does not answer fails it in about half a minute, not after the three
#: minutes of retries (``retry_timeout``: 180 s) a data file's upload is given.
SMALL_REQUESTS = {"timeout": "10s", "connect_timeout": "5s", "retry_timeout": "20s"}

#: Object-store schemes and the delta-rs names they go by.
SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


#: The environment's store credentials: their values never appear in what Combined keeps or shows.
CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET",
)


def remember_credentials() -> None:
    """Mask the store credentials in the environment in every text Combined redacts.

    A store's error can quote one (S3 names the access key id in the body of
    a ``SignatureDoesNotMatch``, which delta-rs quotes whole), and such an
    error reaches a Run's error, the Activity feed and the terminal.
    """
    from combined._credentials import remember_secret

    for name in CREDENTIAL_ENV:
        if value := os.environ.get(name, "").strip():
            remember_secret(value)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class LakeStore:
    """The lake's root and how to reach it."""

    root: str

    @classmethod
    def at(cls, root: str | Path) -> LakeStore:
        """The store of ``root``: a ``file://`` URL or a path is local."""
        text = str(root)
        if text.startswith("file://"):
            text = text.removeprefix("file://")
        return cls(text.rstrip("/") if "://" in text else text)

    @property
    def scheme(self) -> str:
        """The URL scheme, or ``file`` for a local lake."""
        return urlsplit(self.root).scheme.lower() if "://" in self.root else "file"

    @property
    def remote(self) -> bool:
        """Whether the lake is in an object store."""
        return self.scheme != "file"

    def join(self, *parts: str) -> str:
        """The location of ``parts`` under the root."""
        return (
            "/".join([self.root.rstrip("/"), *parts])
            if self.remote
            else str(Path(self.root, *parts))
        )

    def child(self, location: str | Path, name: str) -> str:
        """The location of ``name`` under ``location``."""
        return f"{str(location).rstrip('/')}/{name}" if self.remote else str(Path(location, name))

    # -- delta-rs ------------------------------------------------------------------

    def storage_options(self, *, small: bool = False) -> dict[str, str] | None:
        """delta-rs options: safe concurrent commits through the store's conditional put.

        Everything else (keys, region, endpoint, ``AWS_ALLOW_HTTP``, Azure's
        account and emulator) delta-rs reads from the environment itself; a
        GCS emulator (``STORAGE_EMULATOR_HOST``) it is pointed at here.
        ``small``: a table of small records, whose requests are bounded
        tighter (:data:`SMALL_REQUESTS`).
        """
        options = self._storage_options()
        if not small or not self.remote:
            return options
        return {**SMALL_REQUESTS, **(options or {})}

    def _storage_options(self) -> dict[str, str] | None:
        remember_credentials()
        if self.scheme in ("gs", "gcs"):
            emulator = _gcs_emulator()
            return None if emulator is None else {"google_service_account_key": emulator[0]}
        if self.scheme not in ("s3", "s3a"):
            return None
        options: dict[str, str] = {}
        # (AWS_S3_LOCKING_PROVIDER no longer counts: delta-rs 1.x dropped its DynamoDB log
        # store, delta-io/delta-rs issue 4464, and would commit without any guard)
        if not any(os.environ.get(k) for k in ("AWS_CONDITIONAL_PUT", "aws_conditional_put")):
            options["conditional_put"] = "etag"
        return options

    # -- files -------------------------------------------------------------------

    @cached_property
    def fs(self) -> pafs.FileSystem:
        """The Arrow filesystem holding the lake (built once, from the environment)."""
        remember_credentials()
        return _filesystem(self.scheme, self.root)

    @cached_property
    def probe_fs(self) -> pafs.FileSystem:
        """:attr:`fs` with fewer, shorter tries, for the probe a capture and `check` start
        with (:data:`PROBE_ATTEMPTS`): a store that cannot be reached is said so in
        seconds, where the data files' tries took 84 s to say it."""
        remember_credentials()
        return _filesystem(self.scheme, self.root, probe=True)

    @cached_property
    def waiting_fs(self) -> pafs.FileSystem:
        """:attr:`probe_fs` with one try of each request, each given a few seconds: for a
        worker that probes again and again while the store does not answer
        (``runtime._lake_wait``), and stops at once when asked (a request in flight
        holds the process's exit until it ends)."""
        remember_credentials()
        return _filesystem(self.scheme, self.root, probe=True, probes=1, seconds=3)

    @cached_property
    def reading_fs(self) -> pafs.FileSystem:
        """:attr:`fs` with :data:`PROBE_ATTEMPTS` tries of 3 s a request, for a read alone
        (``status``, ``sql``, ``publications``: a person waits, and runs it again): a
        store that never answers is told in about 10 s, not Arrow's 11 tries' 140 s."""
        remember_credentials()
        return _filesystem(self.scheme, self.root, probe=True, seconds=3)

    @cached_property
    def sizes(self) -> dict[str, int]:
        """The sizes of the store's Parquet files seen so far, by :meth:`path`.

        A Parquet file in the lake is written once under a name of its own
        and never changes (a Delta data file, a Delivery, a checkpoint), so
        its size is asked of the store once: DuckDB opened each file of a
        table several times in every query, each open a HEAD request (738 of
        them in one small capture of a 17-file table on S3).
        """
        return _Bounded(_FACTS_MAX)

    @cached_property
    def opened(self) -> dict[str, Any]:
        """The store's Parquet files DuckDB has opened, by :meth:`path` (see :class:`_OpenAt`).

        Opening a file of an object store asks for its size (a HEAD request),
        and DuckDB opens each file of a table several times in every query:
        108 of a small capture's ~400 requests. The files never change, and
        reads of an opened one by offset are safe from several threads.
        """
        return _Bounded(_OPENED_MAX)

    @cached_property
    def stamps(self) -> dict[str, Any]:
        """The modification times DuckDB asked of the store's Parquet files, by :meth:`path`.

        DuckDB asks at every open (to keep a file's footer cached); one HEAD
        request each, for a file that never changes.
        """
        return _Bounded(_FACTS_MAX)

    def path(self, location: str | Path) -> str:
        """``location`` as a path of :attr:`fs` (an object store's ``bucket/key``)."""
        text = str(location)
        if not self.remote:
            return text
        parts = urlsplit(text)
        return f"{parts.netloc}{parts.path}"

    def exists(self, location: str | Path) -> bool:
        """Whether a file is at ``location``."""
        if not self.remote:
            return os.path.exists(location)
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(self.path(location)).type == pafs.FileType.File)

    def size(self, location: str | Path) -> int:
        """The byte size of the file at ``location``."""
        if not self.remote:
            return os.path.getsize(location)
        path = self.path(location)
        if (known := self.sizes.get(path)) is not None:
            return known
        info = self.fs.get_file_info(path)
        if info.size is None:  # (no such object: Arrow answers a size of None)
            raise FileNotFoundError(f"no file at {location}")
        size = int(info.size)
        if path.endswith(".parquet"):
            self.sizes[path] = size
        return size

    def directories(self, location: str | Path, *, reading: bool = False) -> set[str] | None:
        """The names of the directories right under ``location`` (an object store's common
        prefixes); None when the store cannot list it (``reading``: :attr:`reading_fs`)."""
        import pyarrow.fs as pafs

        from combined.errors import CombinedError

        try:
            if not self.remote:
                return {p.name for p in Path(location).iterdir() if p.is_dir()}
            found = (self.reading_fs if reading else self.fs).get_file_info(
                pafs.FileSelector(self.path(location), allow_not_found=True)
            )
        except FileNotFoundError:
            return set()
        except (OSError, CombinedError):  # (unreachable, refused: not "none")
            return None
        return {f.base_name for f in found if f.type == pafs.FileType.Directory}

    def delete_tree(self, location: str | Path) -> None:
        """Remove everything under ``location`` (a table's directory), when it is there."""
        if not self.remote:
            if Path(location).exists():
                shutil.rmtree(location)
            return
        import pyarrow.fs as pafs

        if self.fs.get_file_info(self.path(location)).type != pafs.FileType.NotFound:
            self.fs.delete_dir(self.path(location))

    def makedirs(self, location: str | Path) -> None:
        """Create a local directory (object stores have none to create)."""
        if not self.remote:
            Path(location).mkdir(parents=True, exist_ok=True)

    def put(self, local: Path, location: str | Path) -> None:
        """Place the local file ``local`` at ``location``: a hard link, else a copy or upload."""
        if not self.remote:
            try:
                os.link(local, location)
            except OSError:
                shutil.copyfile(local, location)
            return
        # Closed here, where an upload the store refused raises: Arrow's
        # copy_files closed it on destruction, where the error is only printed
        # ("Error ignored when destroying file"), and the file seemed uploaded.
        with open(local, "rb") as src, self.fs.open_output_stream(self.path(location)) as out:
            shutil.copyfileobj(src, out, _UPLOAD_BLOCK)

    def copy(self, source: str | Path, target: str | Path) -> None:
        """Copy a lake file to another lake location (server-side on an object store)."""
        if not self.remote:
            self.put(Path(source), target)
            return
        self.fs.copy_file(self.path(source), self.path(target))

    def move_in(self, local: Path, location: str | Path) -> None:
        """Move the local file ``local`` to ``location`` (uploaded, then removed locally)."""
        if not self.remote:
            shutil.move(str(local), str(location))
            return
        self.put(local, location)
        local.unlink()

    def delete(self, location: str | Path) -> None:
        """Remove the file at ``location`` when it is there."""
        if not self.remote:
            Path(location).unlink(missing_ok=True)
            return
        import pyarrow.fs as pafs

        info = self.fs.get_file_info(self.path(location))
        if info.type == pafs.FileType.File:
            self.fs.delete_file(self.path(location))

    def sha256(self, location: str | Path) -> str:
        """The sha256 of a lake file's bytes (read as a stream)."""
        import hashlib

        if not self.remote:
            with open(location, "rb") as f:  # (one reused buffer: see delivery.file_hash)
                return hashlib.file_digest(f, "sha256").hexdigest()
        h = hashlib.sha256()
        with self.fs.open_input_stream(self.path(location)) as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def read_bytes(self, location: str | Path, *, reading: bool = False) -> bytes | None:
        """The bytes of a (small) lake file, or None when nothing is there (``reading``:
        through :attr:`reading_fs`, for a read alone)."""
        if not self.remote:
            try:
                return Path(location).read_bytes()
            except FileNotFoundError:
                return None
        try:
            fs = self.reading_fs if reading else self.fs
            with fs.open_input_stream(self.path(location)) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    @contextmanager
    def written(self, location: str | Path) -> Iterator[tuple[str, pafs.FileSystem | None]]:
        """Write a file at ``location`` whole or not at all: yields (path, filesystem).

        Locally the writer fills a hidden partial file that replaces
        ``location`` once written; an object only appears when its upload completes.
        """
        if self.remote:
            try:
                yield self.path(location), self.fs
            except BaseException:
                self.delete(location)
                raise
            return
        target = Path(location)
        partial = target.with_name(f".{target.name}.partial")
        try:
            yield str(partial), None
            partial.replace(target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def open_input(self, location: str | Path) -> Any:
        """A random-access file over ``location`` (for :class:`pyarrow.parquet.ParquetFile`)."""
        if not self.remote:
            return str(location)
        return self.fs.open_input_file(self.path(location))

    def parquet_schema(self, location: str | Path) -> pa.Schema:
        """The Arrow schema in a Parquet file's footer."""
        import pyarrow.parquet as pq

        if not self.remote:
            return pq.read_schema(str(location))
        return pq.read_schema(self.path(location), filesystem=self.fs)

    def read_table(self, location: str | Path) -> pa.Table:
        """A whole (small) Parquet file of the lake."""
        import pyarrow.parquet as pq

        if not self.remote:
            return pq.read_table(str(location))
        return pq.read_table(self.path(location), filesystem=self.fs)

    # -- DuckDB ------------------------------------------------------------------

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let ``con`` read this store's URLs (``read_parquet('s3://...')``) through :attr:`fs`.

        DuckDB fetches no extension here: an object store's files are read by
        Arrow, wrapped as an fsspec filesystem. Nothing to do for a local lake.
        """
        if not self.remote or self.scheme in con.list_filesystems():
            return
        con.register_filesystem(_duck_filesystem(self.scheme)(self))

    @contextmanager
    def duck(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB connection that reads this store, closed on leaving.

        A local lake's is a cursor of the process's one in-memory database:
        opening a database costs ~14 ms of CPU, more than the count a
        capture's check asks of a small table (a capture of 200 small tables
        opened 400). An object store's is a database of its own, whose
        filesystem is this store's (a database keeps one a scheme).
        """
        import duckdb

        if self.remote:
            con = duckdb.connect()
            self.attach(con)
        else:
            con = _shared_duck().cursor()
        try:
            yield con
        finally:
            con.close()

    def duck_source(self, con: duckdb.DuckDBPyConnection, files: Sequence[str]) -> str:
        """A ``FROM`` item over Parquet ``files`` of the lake, columns matched by name."""
        self.attach(con)
        listing = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
        return f"read_parquet([{listing}], union_by_name = true)"

    def arrow_source(
        self, con: duckdb.DuckDBPyConnection, name: str, files: Sequence[str], schema: pa.Schema
    ) -> str:
        """``files`` of ``schema`` as an Arrow dataset registered as ``name`` in ``con``.

        For a connection that may open no file itself (a locked query): Arrow
        reads the store, DuckDB scans what it hands over.
        """
        con.register(name, self.dataset(files, schema))
        return '"' + name.replace('"', '""') + '"'

    def dataset(self, files: Sequence[str], schema: pa.Schema) -> Any:
        """Parquet ``files`` of the lake as an Arrow dataset of ``schema``, read by Arrow itself.

        Not delta-rs's ``to_pyarrow_dataset()``: it reads through a Python
        filesystem, and an Arrow thread that drops the last of its files while
        the interpreter exits aborts the process ("terminate called without
        an active exception", exit 134), whatever the command had done.
        """
        import pyarrow.dataset as ds

        if not self.remote:
            return ds.dataset(list(files), schema=schema, format="parquet")
        paths = [self.path(f) for f in files]
        return ds.dataset(paths, schema=schema, filesystem=self.fs, format="parquet")


_DUCK: tuple[int, Any] | None = None


def _shared_duck() -> duckdb.DuckDBPyConnection:
    """The process's in-memory DuckDB database (a new one after a fork)."""
    import duckdb

    global _DUCK
    held = _DUCK
    if held is None or held[0] != os.getpid():
        # (it keeps no file's bytes between queries: the files are the lake's)
        held = _DUCK = (
            os.getpid(),
            duckdb.connect(":memory:", config={"enable_external_file_cache": False}),
        )
    con: duckdb.DuckDBPyConnection = held[1]
    return con


def _duck_filesystem(scheme: str) -> type:
    """An fsspec class over an Arrow filesystem, for DuckDB's reads of ``scheme`` URLs.

    Its paths are the store's ``bucket/key``: fsspec's Arrow wrapper would
    drop an ``az://`` URL's container (it keeps only S3's and GCS's buckets).
    """
    from fsspec.implementations.arrow import ArrowFile, ArrowFSWrapper

    class LakeFS(ArrowFSWrapper):  # type: ignore[misc]
        protocol = (scheme,)
        cachable = False  # (fsspec would hand one store's sizes to another's connection)

        def __init__(self, store: LakeStore, **kwargs: Any) -> None:
            super().__init__(store.fs, **kwargs)
            # The store's own caches of its immutable Parquet files' facts.
            self.sizes, self.opened, self.stamps = store.sizes, store.opened, store.stamps

        def _open(self, path: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            key = self._strip_protocol(path)
            if mode != "rb" or not key.endswith(".parquet"):
                return super()._open(path, mode, *args, **kwargs)
            if (shared := self.opened.get(key)) is None:
                shared = self.opened[key] = self.fs.open_input_file(key)
                self.sizes[key] = int(shared.size())
            return ArrowFile(self, _OpenAt(shared), key, mode)

        def exists(self, path: Any, **kwargs: Any) -> bool:
            # DuckDB globs every file it is given: a file whose size is known is there.
            if self._strip_protocol(path) in self.sizes:
                return True
            return bool(super().exists(path, **kwargs))

        def modified(self, path: Any) -> Any:
            # Asked at every open (DuckDB's cache of file footers); a Parquet file never changes.
            key = self._strip_protocol(path)
            if (when := self.stamps.get(key)) is None:
                when = super().modified(path)
                if key.endswith(".parquet"):
                    self.stamps[key] = when
            return when

        def info(self, path: Any, **kwargs: Any) -> Any:
            key = self._strip_protocol(path)
            if (size := self.sizes.get(key)) is not None:
                return {"name": key, "size": size, "type": "file", "mtime": None}
            entry = super().info(path, **kwargs)
            if entry["type"] == "file" and key.endswith(".parquet"):
                self.sizes[key] = int(entry["size"])
            return entry

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            if isinstance(path, list):
                return [cls._strip_protocol(p) for p in path]
            text = str(path)
            return (text.split("://", 1)[1] if "://" in text else text).rstrip("/")

    return LakeFS


#: The bytes read from a local file at a time while it is uploaded.
_UPLOAD_BLOCK = 8 << 20

#: Files kept open for DuckDB's reads of one store (each a path and a size, no connection).
_OPENED_MAX = 4096
#: Parquet files whose size and time one store remembers (~200 bytes each).
_FACTS_MAX = 65_536


class _Bounded(dict[str, Any]):
    """A cache of immutable files' facts that starts over once it holds ``limit`` of them.

    A long-lived engine (a worker following CDC for weeks) reads ever newer
    files: forgetting every fact at once costs one request a file again,
    where keeping them all would grow without end.
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: str, value: Any) -> None:
        if len(self) >= self.limit and key not in self:
            self.clear()
        super().__setitem__(key, value)


class _OpenAt:
    """One open of a shared random-access file: a position of its own, reads by offset.

    What fsspec's ``ArrowFile`` asks of its stream. Reads at an offset share
    the file between DuckDB's threads; closing this open leaves the file open.
    """

    def __init__(self, shared: Any) -> None:
        self._shared = shared
        self._pos = 0
        self.closed = False

    def size(self) -> int:
        return int(self._shared.size())

    def read(self, nbytes: int | None = None) -> bytes:
        if nbytes is None or nbytes < 0:
            nbytes = max(self.size() - self._pos, 0)
        data: bytes = self._shared.read_at(nbytes, self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size()}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _filesystem(
    scheme: str, root: str, *, probe: bool = False, probes: int = PROBE_ATTEMPTS, seconds: int = 20
) -> pafs.FileSystem:
    """The Arrow filesystem for ``scheme``, configured from the store's usual environment.

    ``probe``: for a probe object, its requests tried ``probes`` times at most,
    each without an answer for ``seconds`` at most (S3; the other stores'
    defaults already fail an unreachable one in seconds).
    """
    import pyarrow.fs as pafs

    env = os.environ
    if scheme in ("s3", "s3a"):
        options: dict[str, Any] = {}
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if endpoint:
            parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        if _truthy(env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")):
            options["force_virtual_addressing"] = True
        # As many tries as delta-rs gives a commit's requests: Arrow's three
        # failed a Run at its next lake file on a burst of 503 SlowDown.
        attempts = env.get("AWS_MAX_ATTEMPTS", "").strip()
        tries = int(attempts) if attempts.isdigit() and int(attempts) > 0 else S3_ATTEMPTS
        if probe:
            tries = min(tries, probes)
            options.update(connect_timeout=min(seconds, 5), request_timeout=seconds)
        options["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=tries)
        return pafs.S3FileSystem(**options)
    if scheme in ("gs", "gcs"):
        emulator = _gcs_emulator()
        if emulator is None:
            _require_google_credentials(root)
            return pafs.GcsFileSystem()
        parts = urlsplit(emulator[1])
        return pafs.GcsFileSystem(
            anonymous=True, endpoint_override=parts.netloc, scheme=parts.scheme
        )
    return _azure_filesystem(root)


#: The Azure Storage emulator's (Azurite's) well-known account and key: public, not a secret.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _gcs_emulator() -> tuple[str, str] | None:
    """A GCS emulator named by ``STORAGE_EMULATOR_HOST``: delta-rs' key for it and its URL.

    The variable Google's client libraries read; delta-rs reaches the emulator
    through a service-account key that names it and turns OAuth off.
    """
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if not host:
        return None
    url = host if "://" in host else f"http://{host}"
    key = {
        "gcs_base_url": url,
        "disable_oauth": True,
        "client_email": "",
        "private_key": "",
        "private_key_id": "",
    }
    return json.dumps(key), url


def _require_google_credentials(root: str) -> None:
    """Raise LakeNotWritable when GCS has no credentials to find.

    Arrow would otherwise wait minutes for a metadata server that a machine
    outside Google Cloud does not have.
    """
    env = os.environ
    gcloud = env.get("CLOUDSDK_CONFIG") or os.path.join(
        os.path.expanduser("~"), ".config", "gcloud"
    )
    if env.get("GOOGLE_APPLICATION_CREDENTIALS") or env.get("GCE_METADATA_HOST"):
        return
    if os.path.exists(os.path.join(gcloud, "application_default_credentials.json")):
        return
    import socket

    try:
        socket.getaddrinfo("metadata.google.internal", 80)
        return  # on Google Cloud: the machine's own credentials
    except OSError:
        pass
    from combined.errors import LakeNotWritable

    raise LakeNotWritable(
        f"the lake at {root} cannot be reached: no Google credentials were found in the "
        "environment (GOOGLE_APPLICATION_CREDENTIALS)",
        hint="set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run "
        "`gcloud auth application-default login`; nothing was captured",
    )


def _azure_filesystem(root: str) -> pafs.FileSystem:
    """Azure Blob Storage from ``AZURE_STORAGE_*``, or Azurite when it is the emulator."""
    import pyarrow.fs as pafs

    env = os.environ
    account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT")
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_KEY")
    if _truthy(env.get("AZURE_STORAGE_USE_EMULATOR")):
        url = env.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
        parts = urlsplit(url if "://" in url else f"http://{url}")
        return pafs.AzureFileSystem(
            account_name=account or AZURITE_ACCOUNT,
            account_key=key or AZURITE_KEY,
            blob_storage_authority=parts.netloc,
            dfs_storage_authority=parts.netloc,
            blob_storage_scheme=parts.scheme,
            dfs_storage_scheme=parts.scheme,
        )
    if not account:
        from combined.errors import LakeNotWritable

        raise LakeNotWritable(
            f"the lake at {root} names no Azure storage account",
            hint="set AZURE_STORAGE_ACCOUNT_NAME (and AZURE_STORAGE_ACCOUNT_KEY, or sign in "
            "with the Azure CLI) in the environment",
        )
    return pafs.AzureFileSystem(account_name=account, account_key=key)
