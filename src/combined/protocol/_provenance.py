"""The provenance columns every projected row carries (docs/architecture.md, section 4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from combined.protocol._digest import Digest

#: What every column Combined adds to a row is named with.
PREFIX = "_combined_"

ID = "_combined_id"
OP = "_combined_op"
EMITTED_AT = "_combined_emitted_at"
OBSERVED_AT = "_combined_observed_at"
INGESTED_AT = "_combined_ingested_at"
RUN_ID = "_combined_run_id"
DELIVERY_ID = "_combined_delivery_id"
PAYLOAD_HASH = "_combined_payload_hash"
PRODUCER = "_combined_producer"
SOURCE_POSITION = "_combined_source_position"
#: A staged row's place in its capture (a control column, never in the lake).
ORDINAL = "_combined_ordinal"
#: A change's list of the columns whose (TOAST) value it left as it was (a control column).
UNCHANGED = "_combined_unchanged"

PROVENANCE_COLUMNS: tuple[str, ...] = (
    ID,
    OP,
    EMITTED_AT,
    OBSERVED_AT,
    INGESTED_AT,
    RUN_ID,
    DELIVERY_ID,
    PAYLOAD_HASH,
    PRODUCER,
    SOURCE_POSITION,
)

#: Columns a connector may put in its batches that are not source payload.
CONTROL_COLUMNS: frozenset[str] = frozenset({OP, EMITTED_AT, SOURCE_POSITION, UNCHANGED, ORDINAL})


def provenance_fields(digest: Digest = "hex") -> list[pa.Field]:
    """The Arrow fields of the provenance columns, in order, with digests in ``digest`` format."""
    import pyarrow as pa

    from combined.protocol._digest import digest_type

    ts = pa.timestamp("us", tz="UTC")
    types = {EMITTED_AT: ts, OBSERVED_AT: ts, INGESTED_AT: ts}
    types |= {ID: digest_type(digest), PAYLOAD_HASH: digest_type(digest)}
    return [pa.field(name, types.get(name, pa.string())) for name in PROVENANCE_COLUMNS]
