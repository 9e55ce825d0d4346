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
    assert secret[:10] not in quoted and secret[-10:] not in quoted
    assert quoted.endswith("and more / second line ***")


def test_a_chain_of_causes_is_quoted_on_one_line_with_its_root_cause() -> None:
    """delta-rs writes an error's causes a line each: the last one says what went wrong."""
    text = (
        "Generic S3 error: Error performing PUT http://127.0.0.1:9/b/lake/_delta_log/x.json\n"
        "\nCaused by:\n    0: HTTP error: error sending request\n"
        "    1: client error (Connect)\n    2: tcp connect error: Connection refused (os error 111)"
    )
    quoted = store_detail(text)
    assert "\n" not in quoted and len(quoted) <= 300
    assert quoted.startswith("Generic S3 error: Error performing PUT")
    assert quoted.endswith("tcp connect error: Connection refused (os error 111)")


def test_an_empty_error_says_so() -> None:
    assert store_detail("  \n") == "no detail"


@pytest.mark.parametrize(
    ("text", "denied"),
    [
        # CI once read this probe's name as an HTTP 403 and blamed permissions
        # when there were no credentials at all.
        (
            "When initiating multiple part upload for key 'lake/.write-probe-013fe7cfb4984e0f9661"
            "ebf403256c3f' in bucket 'b': AWS Error INTERNAL_FAILURE during CreateMultipartUpload",
            False,
        ),
        ("request id AB403CD failed: INTERNAL_FAILURE", False),
        ("HTTP status client error (403 Forbidden) for url", True),
        ("Server returned 403", True),
        ("AWS Error ACCESS_DENIED during PutObject", True),
    ],
)
def test_a_403_is_read_only_as_a_whole_word(text: str, denied: bool) -> None:
    from combined.lake._probe import _REASONS, _shows

    assert _shows(_REASONS[2][0], text) is denied


@pytest.mark.parametrize(
    "text",
    [
        "Generic S3 error: Error after 10 retries in 89s, max_retries:10: error sending "
        "request for url (http://127.0.0.1:18999/b/.write-probe-1)\n\nCaused by:\n    0: "
        "client error (Connect)\n    1: tcp connect error: Connection refused (os error 111)",
        "When initiating multiple part upload for key '.write-probe-1' in bucket 'b': AWS "
        "Error NETWORK_CONNECTION during CreateMultipartUpload operation: curlCode: 7, "
        "Couldn't connect to server",
        "tcp connect error: Connection refused (os error 111)",
    ],
)
def test_a_store_that_does_not_answer_is_told_apart_from_one_that_refuses(text: str) -> None:
    """It was "the store refused the write: check the lake's URL, credentials and
    permissions", of a store nothing answered for."""
    from combined.lake._probe import refusal

    found = refusal(text)
    assert found is not None and found[0] == "the store could not be reached"
    assert "endpoint" in found[1]
    # (a timeout is no refusal, nor a store that could not be reached: found by review)
    assert (
        refusal("Generic S3 error: error sending request for url (x): operation timed out") is None
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("AWS Error ACCESS_DENIED during PutObject operation: Access Denied", "to write"),
        ("AWS Error ACCESS_DENIED during ListObjectsV2 operation: Access Denied", "to list"),
        ("Generic S3 error: Error performing list request: 403 Forbidden", "to list"),
        ("AWS Error ACCESS_DENIED during HeadObject operation", "to list (ListBucket) or read"),
        (  # delta-rs reading a table's log
            "Kernel error -> The operation lacked the necessary privileges to complete for path "
            "lake/t/_delta_log/_last_checkpoint\n  ↳ Error performing GET "
            "http://127.0.0.1:9/b/lake/t/_delta_log/_last_checkpoint in 1.5ms - Server returned "
            "non-2xx status code\n   ↳ 403 Forbidden",
            "to list (ListBucket) or read",
        ),
    ],
)
def test_a_denied_list_or_read_is_not_told_as_a_missing_write_permission(
    text: str, says: str
) -> None:
    """A LIST the store refused (403) was told "the credentials lack permission to write
    (PutObject) and delete (DeleteObject)", and the hint to grant those alone."""
    from combined.lake._probe import refusal

    told = refusal(text)
    assert told is not None and f"lack permission {says}" in told[0], told


def test_a_store_setting_that_is_not_valid_is_told_as_one() -> None:
    """AWS_ALLOW_HTTP=maybe passed the probe, then failed the commit with the hint to wait
    for the store ("once it answers"), as if it were down (found by an object-store review)."""
    from combined.lake._probe import refusal

    told = refusal('Generic Config error: failed to parse "maybe" as boolean')
    assert told is not None and "setting of the store in the environment" in told[0]
    assert "AWS_" in told[1]
