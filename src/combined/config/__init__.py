"""The project file (``combined.yaml``) as typed models, and secret references.

Load a project with :func:`load_project`; resolve a source's secrets at
connect time only with :meth:`Project.resolved_config` or
:func:`resolve_secrets`; store and hash configurations only in their
:func:`redact_config` form.
"""

from combined._credentials import is_secret_ref
from combined.config._loader import load_project, parse_project
from combined.config._models import (
    DEFAULT_CATALOG,
    PROJECT_ENV,
    PROJECT_FILE,
    CursorConfig,
    CursorNulls,
    DatasetConfig,
    DeletesConfig,
    DeliveryLimits,
    DriftOutcome,
    DriftPolicy,
    Project,
    QuarantinePolicy,
    SecretRef,
    SourceConfig,
    StagingLimits,
    Strategy,
    SyncMode,
    WebhookConfig,
    format_duration,
    parse_duration,
    parse_size,
)
from combined.config._secrets import (
    canonical_digest,
    config_digest,
    find_secret_refs,
    redact_config,
    resolve_secret,
    resolve_secrets,
)
from combined.config._template import EXAMPLE_PROJECT, write_example
from combined.config._urls import CATALOG_DRIVERS, catalog_kind

__all__ = [
    "CATALOG_DRIVERS",
    "DEFAULT_CATALOG",
    "EXAMPLE_PROJECT",
    "PROJECT_ENV",
    "PROJECT_FILE",
    "CursorConfig",
    "DeletesConfig",
    "CursorNulls",
    "DatasetConfig",
    "DeliveryLimits",
    "DriftOutcome",
    "DriftPolicy",
    "Project",
    "QuarantinePolicy",
    "SecretRef",
    "SourceConfig",
    "StagingLimits",
    "Strategy",
    "SyncMode",
    "WebhookConfig",
    "canonical_digest",
    "catalog_kind",
    "config_digest",
    "find_secret_refs",
    "format_duration",
    "is_secret_ref",
    "load_project",
    "parse_duration",
    "parse_project",
    "parse_size",
    "redact_config",
    "resolve_secret",
    "resolve_secrets",
    "write_example",
]
