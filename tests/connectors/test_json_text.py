"""The JSON text Combined makes of decoded values: one encoder built once, json.dumps's output."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from combined.connectors._subprocess._schema import json_default, json_encoder
from combined.connectors.http._restart import canonical


@pytest.mark.parametrize(
    "value",
    [
        {"b": [1, 2.5, None, True], "a": {"z": "é ☃ \u2028", "y": Decimal("1.50")}},
        [Decimal("12345678901234567890"), Decimal("0.1"), float("nan"), float("-inf")],
        'naïve "quoted" \\ text\n',
        Decimal("7.000"),
        [],
    ],
)
def test_the_encoder_built_once_writes_what_json_dumps_writes(value: Any) -> None:
    assert canonical(value) == json.dumps(
        value, sort_keys=True, default=json_default, separators=(",", ":")
    )
    assert json_encoder(ensure_ascii=False)(value) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, default=json_default
    )
