"""The example project file that ``combined init`` writes."""

from __future__ import annotations

import os
from pathlib import Path

from combined.errors import ConfigError

EXAMPLE_PROJECT = """\
# yaml-language-server: $schema=./combined.schema.json
# combined.yaml: what Combined captures, from where, into which lake.
# Every key, its type and default: docs/configuration.md. Editors complete and
# check this file with combined.schema.json, written next to it by
# `combined init` (refresh it after an upgrade: combined schema -o combined.schema.json).
# Relative paths are relative to this file's directory.
version: 1

# The lake: a local directory, or a file://, s3://, gs:// or az:// URL. An
# object store's credentials come from its usual environment (AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, ...), never from this
# file; see docs/object-stores.md.
lake: ./lake

# The catalog (control plane). The default is an embedded SQLite file; at
# scale use PostgreSQL, with the password given as a secret reference:
#   catalog: postgresql://combined@db.example.com/combined
#   catalog_password: {secret: "env:CATALOG_PW"}
catalog: sqlite:///.combined/catalog.db

# Limits on what one run may stage before it commits.
staging:
  max_bytes: 20GiB
  max_files: 10000
  max_path_length: 240
  # Codec of the staged parts: none (least CPU), lz4 or zstd (less disk).
  compression: none

# Memory the snapshot reduction may use before it spills to disk.
reduction_memory: 256MiB

# What `combined maintain` keeps (a dataset may set its own); unset, every
# publication and Delivery is kept. See docs/maintenance.md.
# retention:
#   publications: 90d   # how long --as-of / --publication keep answering
#   raw: 365d           # how long committed Deliveries stay in _deliveries/
#   compact_files: 32   # a capture compacts its table past this many small files
#   orphans: 7d         # remove files no commit names (a killed writer's) once 7 days old

sources:
  shop:
    connector: sqlite
    # Passed to the connector, which refuses keys it does not take. Never
    # write a secret here: a literal under a credential-like key (password,
    # token, api_key, ...) or inside a connection string is refused. Any
    # value may be a reference instead: {secret: "env:NAME"} or
    # {secret: "file:PATH"}; an empty secret is refused too.
    config:
      path: ./shop.db           # a sample shop `combined init` writes beside this file
    datasets:
      # A table read whole each run; changes are found by comparing with the
      # previous capture and merged by key.
      orders:
        key: [id]
        strategy: snapshot
        sync_mode: incremental
        freshness: 1h
        quarantine:
          reader: owner
          review_every: 7d
      # An event table that only grows: read past the last id seen and keep
      # every row as it arrived.
      events:
        strategy: cursor
        sync_mode: append
        cursor:
          column: id
          lookback: 0
          trust: "ids come from an autoincrement column and rows are never updated"

# BEGIN postgres example
#  crm:
#    connector: postgres
#    config:
#      dsn: postgresql://combined@crm.example.com:5432/crm
#      password: {secret: "env:CRM_PASSWORD"}
#      # columns with no arrow type (money, ranges, geometric), read as text:
#      casts: {"public.invoices.amount_due": "numeric(14,2)"}
#    datasets:
#      customers:
#        relation: public.customers
#        key: [id]
#        strategy: cdc
#        drift: {new_field: evolve, drop: quarantine}
# END postgres example

# BEGIN mariadb example
#  billing:
#    connector: mariadb           # MariaDB or MySQL (`mysql` works too)
#    config:
#      dsn: mysql://combined@billing.example.com:3306/billing
#      password: {secret: "env:BILLING_PASSWORD"}
#    datasets:
#      invoices:
#        key: [id]
#      payments:
#        key: [id]
#        strategy: cursor
#        cursor:
#          column: id
#          lookback: 1000
#          trust: "auto_increment; a later insert can take a smaller id, hence the lookback"
#      refunds:
#        key: [id]
#        strategy: cursor
#        cursor:
#          column: updated_at
#          trust: "ON UPDATE CURRENT_TIMESTAMP"
#          # No window reaches a row whose cursor is NULL: fail (the default)
#          # stops the capture, include reads them in every capture, exclude
#          # leaves them out. A NOT NULL column is not checked.
#          nulls: include
#        # Rows whose deleted_at is set leave the projection as deletes (billed
#        # as such); the raw layer keeps them as read. A boolean flag works too.
#        deletes: {flag: deleted_at}
# END mariadb example

# BEGIN singer example
#  github:
#    connector: singer            # any Singer tap (see docs/singer.md)
#    config:
#      command: tap-github        # a name on PATH or a path; or an argv list
#      config:                    # the tap's own settings, given to it in a private file
#        repositories: [meltano/meltano]
#        start_date: "2024-01-01T00:00:00Z"
#        auth_token: {secret: "env:GITHUB_TOKEN"}
#      idle_timeout: 600          # seconds without a line from the tap before it is stopped
#    datasets:
#      repositories:              # a stream, read whole each run
#        key: [id]                # the stream's key_properties (`combined discover github`)
#      issues:
#        stream: issues           # the stream's tap_stream_id (default: the dataset name)
#        key: [id]
#        strategy: cursor         # the tap resumes from its own STATE, committed with the data
#        cursor:
#          column: updated_at     # the stream's replication_key
#          trust: "tap-github bookmarks issues by updated_at; deletes are not seen"
# END singer example

# BEGIN airbyte example
#  gh:
#    connector: airbyte           # any Airbyte-protocol source (see docs/airbyte.md)
#    config:
#      command: source-github     # `pipx install airbyte-source-github`; or an argv, e.g.
#      # [docker, run, --rm, -i, -v, "{files}:{files}", airbyte/source-github]
#      config:                    # the connector's own settings, given to it in a private file
#        repositories: [airbytehq/airbyte]
#        start_date: "2024-01-01T00:00:00Z"
#        credentials:
#          personal_access_token: {secret: "env:GITHUB_TOKEN"}
#      idle_timeout: 600          # seconds without a line from the connector before it is stopped
#    datasets:
#      repositories:              # a stream, read whole each run (full_refresh)
#        key: [id]                # its source_defined_primary_key (`combined discover gh`)
#      issues:
#        stream: issues           # the stream's name, or namespace.name (default: the dataset name)
#        key: [id]
#        strategy: cursor         # incremental, resuming from its per-stream STATE
#        cursor:
#          column: updated_at     # the stream's cursor field
#          trust: "source-github's issues cursor is updated_at; deletes are not seen"
# END airbyte example

# BEGIN http example
#  api:
#    connector: http              # a REST/JSON API (see docs/http.md)
#    config:
#      base_url: https://api.example.com/v1
#      # The only place a secret goes; it never reaches an error, log or the catalog.
#      auth: {type: bearer, token: {secret: "env:API_TOKEN"}}
#      rate_limit: 5              # requests per second
#      endpoints:                 # named endpoints; a dataset's relation names one
#        orders:
#          path: /orders
#          records: data          # where the list is in the body (the body itself if unset)
#          # cursor or link paging is safe over changing data; page/offset can skip rows
#          paginate: {style: cursor, param: page_token, next: meta.next_token}
#          fields: {total: "decimal(2)", updated_at: timestamp}   # others are inferred
#          since: {param: updated_since, format: iso}             # for strategy cursor
#    datasets:
#      orders:
#        key: [id]                # `combined discover api` shows key candidates
#        strategy: cursor
#        cursor:
#          column: updated_at
#          lookback: 5m           # re-read a window; the key merges the overlap
#          trust: "the API documents updated_at as set on every change"
# END http example

# BEGIN files example
#  exports:
#    connector: files             # local CSV, Parquet or JSON files (see docs/files.md)
#    config:
#      path: ./exports            # the directory, relative to this file
#      files:                     # named file sets; a dataset's relation names one
#        orders:
#          glob: "orders/*.csv"   # format from the extension, or `format: csv`
#          delimiter: ";"
#          # Declared types do not change with the data; undeclared ones are
#          # inferred at each capture, and a change is drift under the policy.
#          columns: {id: BIGINT, zip: VARCHAR, total: "DECIMAL(12,2)"}
#        events:
#          glob: "events/**/*.parquet"
#          allow_empty: true      # no file is a real state (else no file is refused)
#    datasets:
#      orders:
#        key: [id]                # files enforce no key: `combined discover exports` shows evidence
#      events:
#        key: [event_id]
#        control_sum: amount      # parquet row counts come from the footers; this sums a column
# END files example
"""
"""A commented ``combined.yaml`` that loads as it is.

The lines between ``# BEGIN postgres example`` and ``# END postgres example``
(and the ``mariadb``, ``singer``, ``airbyte``, ``http`` and ``files`` ones) are a
source that loads too once their leading ``#`` is removed.
"""


def write_example(path: Path, *, force: bool = False) -> Path:
    """Write :data:`EXAMPLE_PROJECT` to ``path`` and return its absolute path.

    ``path`` may be a directory (or a path that does not exist yet and does
    not end in ``.yaml`` or ``.yml``), in which case ``combined.yaml`` is
    written in it. An existing file is only replaced when ``force`` is true. The JSON
    Schema the file's first line names, ``combined.schema.json``, is written
    (or refreshed) next to it: generated, it holds nothing of the user's.
    """
    from combined.config._reference import SCHEMA_FILE, schema_text

    path = Path(path).expanduser()
    if path.is_dir() or (not path.exists() and path.suffix not in (".yaml", ".yml")):
        path = path / "combined.yaml"  # a directory, made if need be
    path = Path(os.path.abspath(path))
    if path.exists() and not force:
        raise ConfigError(
            f"project file already exists: {path}",
            hint="pass --force to overwrite it, or choose another path",
            file=str(path),
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(EXAMPLE_PROJECT, encoding="utf-8")
        (path.parent / SCHEMA_FILE).write_text(schema_text(), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror or type(exc).__name__}",
            hint="choose a directory this user can write to",
            file=str(path),
        ) from None
    return path
