"""The JSON Schema of ``combined.yaml`` and its Markdown reference, both from the models.

``combined schema`` prints either; the repository keeps the outputs as
``schema/combined.schema.json`` and ``docs/configuration.md``, and a test
checks that they equal what this module generates, so neither can drift
from the models that actually validate the file.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from combined.config._models import (
    AlertSettings,
    CursorConfig,
    DatasetConfig,
    DeletesConfig,
    DeliveryLimits,
    DriftPolicy,
    LoggingSettings,
    NotificationTarget,
    Project,
    QuarantinePolicy,
    SecretRef,
    SourceConfig,
    StagingLimits,
    WebhookConfig,
)
from combined.config._retention import RetentionPolicy
from combined.config._schedule import ScheduleConfig
from combined.config._values import (
    _DURATION_SCHEMA,
    _LOOKBACK_SCHEMA,
    _SIZE_SCHEMA,
    TEXT_SCHEMA,
    GiB,
    KiB,
    MiB,
    format_duration,
)

SCHEMA_FILE = "combined.schema.json"
"""The file name of the schema next to a project file (``combined init`` writes it)."""

_DESCRIPTION = (
    "The project file of Combined: what it captures, from where, into which lake. "
    "Generated from the models that validate it (combined schema)."
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``combined.yaml``."""
    schema = Project.model_json_schema(mode="validation")
    schema["description"] = _DESCRIPTION
    schema["title"] = "combined.yaml"
    dataset = schema["$defs"]["DatasetConfig"]
    # ``relation`` defaults to the dataset's name (the source fills it in) and
    # ``stream`` is the same setting under a Singer stream's name.
    dataset["required"] = [k for k in dataset.get("required", []) if k != "relation"]
    dataset["properties"]["stream"] = {
        **dataset["properties"]["relation"],
        "title": "Stream",
        "description": "The same setting as relation (a Singer or Airbyte stream's name).",
    }
    _close_named_maps(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _close_named_maps(node: Any) -> None:
    """A map of named entries (sources, datasets) takes no other name."""
    if isinstance(node, dict):
        if "patternProperties" in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_named_maps(value)
    elif isinstance(node, list):
        for value in node:
            _close_named_maps(value)


def schema_text() -> str:
    """:func:`json_schema` as the text of ``combined.schema.json``."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# the Markdown reference

#: Each section: its heading (the key's path), the model and a sentence.
_SECTIONS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("Top level", Project, "The keys at the top of `combined.yaml`."),
    ("staging", StagingLimits, "Limits on what one Run stages on this machine."),
    (
        "notifications",
        NotificationTarget,
        "Each target alerts are sent to (docs/operations.md): a signed JSON webhook, or a "
        "Slack-compatible incoming webhook.",
    ),
    ("alerts", AlertSettings, "When a CDC stream counts as at risk (docs/operations.md)."),
    ("logging", LoggingSettings, "How every command logs (docs/operations.md)."),
    (
        "sources.NAME",
        SourceConfig,
        "A source: a connector, its configuration and its datasets. The keys "
        "under `config` belong to the connector; see its page (docs/postgres.md, "
        "docs/mariadb.md, docs/files.md, docs/http.md, docs/singer.md, docs/airbyte.md).",
    ),
    (
        "sources.NAME.datasets.NAME",
        DatasetConfig,
        "A dataset: one relation of the source and how it is captured.",
    ),
    ("cursor", CursorConfig, "The cursor of a dataset with `strategy: cursor`."),
    (
        "deletes",
        DeletesConfig,
        "A dataset's soft-delete flag: a row carrying it is projected as a delete of its key "
        '(docs/architecture.md, "Soft deletes").',
    ),
    ("delivery", DeliveryLimits, "A dataset's Delivery files: one is cut at either limit."),
    ("drift", DriftPolicy, "Each class of schema drift: `evolve`, `quarantine` or `fail`."),
    ("quarantine", QuarantinePolicy, "A dataset's quarantine review."),
    (
        "retention",
        RetentionPolicy,
        "What `combined maintain` keeps (docs/maintenance.md), for the project and per "
        "dataset; a dataset's field wins. Unset: every publication and Delivery is kept, "
        "captures compact a table past 32 files, and files no commit names (orphans) are "
        "reported, never removed.",
    ),
    ("schedule", ScheduleConfig, "A source's or dataset's schedule (docs/schedules.md)."),
    ("webhook", WebhookConfig, "A source's or dataset's signed webhooks (docs/api.md)."),
    (
        "Secret references",
        SecretRef,
        "`catalog_password`, `webhook.secret` and any value under a connector's "
        '`config` may be `{secret: "env:NAME"}` or `{secret: "file:PATH"}`.',
    ),
)

_NAMED_TYPES = {
    json.dumps(_SIZE_SCHEMA, sort_keys=True): "size: bytes, or text such as `64MiB`, `20GB`",
    json.dumps(_DURATION_SCHEMA, sort_keys=True): "duration such as `30s`, `1h`, `7d`",
    json.dumps(_LOOKBACK_SCHEMA, sort_keys=True): (
        "number (the cursor's units) or duration such as `5m`"
    ),
    json.dumps(TEXT_SCHEMA, sort_keys=True): "text",
}


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def _type_of(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A property's schema in a few words."""
    bare = {k: v for k, v in prop.items() if k not in ("default", "title", "description")}
    named = _NAMED_TYPES.get(json.dumps(bare, sort_keys=True))
    if named is not None:
        return named
    if "$ref" in bare:
        name = bare["$ref"].rsplit("/", 1)[-1]
        heading = next(h for h, model, _ in _SECTIONS if model.__name__ == name)
        return f"mapping, see [{heading}](#{_anchor(heading)})"
    if "anyOf" in bare:
        kinds = [_type_of(p, defs) for p in bare["anyOf"] if p != {"type": "null"}]
        if kinds[:1] == ["text"] and len(kinds) == 2 and kinds[1].startswith("list"):
            return "column name or list of column names"
        return " or ".join(kinds)
    if "enum" in bare:
        return " \\| ".join(f"`{v}`" for v in bare["enum"])
    if "const" in bare:
        return f"`{bare['const']}`"
    if "patternProperties" in bare:
        (inner,) = bare["patternProperties"].values()
        return f"names to entries: {_type_of(inner, defs)}"
    if bare.get("type") == "array":
        return f"list of {_type_of(bare['items'], defs)}"
    if bare.get("type") == "integer" and bare.get("minimum") == 1:
        return "whole number above zero"
    return str(bare.get("type", "any"))


def _size_text(value: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if value % unit == 0:
            return f"{value // unit}{name}"
    return str(value)


def _default_of(model: type[BaseModel], name: str, prop: dict[str, Any]) -> str:
    if model is DatasetConfig and name in ("relation", "stream"):
        return "the dataset's name"
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return "see below" if "$ref" in prop else "none"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, int) and _type_of(prop, {}).startswith("size"):
        return f"`{_size_text(value)}`"
    return f"`{value}`"


def _description(prop: dict[str, Any]) -> str:
    text = prop.get("description", "")
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def _table(model: type[BaseModel], root: dict[str, Any]) -> list[str]:
    defs = root["$defs"]
    schema = root if model is Project else defs[model.__name__]
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, prop in schema["properties"].items():
        rows.append(
            f"| `{name}` | {_type_of(prop, defs)} | {_default_of(model, name, prop)} "
            f"| {_description(prop)} |"
        )
    return rows


_INTRO = """\
# combined.yaml reference

<!-- Generated by `combined schema --reference` from the models that validate
the file (src/combined/config/): edit those, then run `make schema`. -->

Every key of the project file, its type and its default. A key not listed
here is refused (a misspelt setting is an error, never ignored). Durations
take the units ms, s, m, h, d and w (`1h30m`); sizes take B, KB, MB, GB, TB
(powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024).

Editors validate and complete the file with its JSON Schema,
`schema/combined.schema.json` (the same models): `combined init` writes a
copy, `combined.schema.json`, next to the project file and names it in the
file's first line, `# yaml-language-server: $schema=./combined.schema.json`.
The path is relative to the project file, so it works offline, in any clone
or copy of the project, and describes exactly the Combined that wrote it;
`combined schema --output combined.schema.json` refreshes it after an
upgrade.
"""

_RULES = """\
## Rules across keys

- `key` is required unless `sync_mode` is `append`: `incremental` merges by
  it and `full_refresh` needs it too; `strategy: cdc` needs it with `append`
  as well. `key: []` says the table has none: it
  needs `strategy: snapshot` and takes neither `history` nor `deletes`, and
  `combined backfill` refuses it.
- `strategy: cursor` requires `cursor`, which no other strategy takes.
- `sync_mode: full_refresh` needs `strategy: snapshot`.
- `sync_mode: append` refuses a cursor `lookback` or `nulls: include`, which
  would keep re-read rows again.
- `columns`, when given, must include the key and cursor columns (and the
  `deletes` flag).
- `deletes` (a soft-delete flag) needs `sync_mode: incremental` and a `key`;
  `combined check` verifies the flag is a boolean or date/time column of the
  relation, or a column that holds its `value:` (docs/architecture.md, "Soft deletes").
- `catalog_password` is only for a `postgresql://` catalog.
- A schedule is `cron` (with an optional `timezone`) or `interval`, not both.
- `combined check` verifies that each dataset's relation, key, cursor and
  columns exist in a SQL source (PostgreSQL, MariaDB/MySQL, SQLite), and
  that the cursor and key can order a read's pages: a PostgreSQL or MariaDB
  cursor is a number, date or timestamp column (not text, time or bits).
  It tells every dataset that fails, each with its hint. Every capture asks
  the same before its Run and exits 2 when refused.
"""


def reference_markdown() -> str:
    """The text of ``docs/configuration.md``."""
    root = json_schema()
    out = [_INTRO]
    for heading, model, sentence in _SECTIONS:
        out += [f"## {heading}", "", sentence, "", *_table(model, root), ""]
    out.append(_RULES)
    return "\n".join(out)
