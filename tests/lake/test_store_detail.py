"""A store's error is quoted masked, even where the quote is cut through a secret."""

from __future__ import annotations

import pytest

from combined.lake._probe import store_detail


def test_a_secret_cut_by_the_quote_limit_is_still_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sEcReT-access-key-0123456789"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    text = "x" * 290 + secret + " and more\nsecond line " + secret
    quoted = store_detail(text)
    assert len(quoted) <= 300
    assert secret[:10] not in quoted
    assert "second line" not in quoted


def test_an_empty_error_says_so() -> None:
    assert store_detail("  \n") == "no detail"
