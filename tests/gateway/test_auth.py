"""API key helpers."""

from __future__ import annotations

import pytest

from gateway.auth import extract_token, generate_api_key, hash_api_key, parse_api_keys_setting


def test_generate_api_key_is_prefixed_and_unique() -> None:
    keys = {generate_api_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert key.startswith("rg_")
        assert len(key) == 3 + 43


def test_hash_api_key_is_sha256_hex() -> None:
    assert hash_api_key("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


def test_parse_api_keys_setting_groups_by_tenant() -> None:
    parsed = parse_api_keys_setting(" alice:k1, bob:k2 ,alice:k3,alice:k1,carol:a:b")
    assert parsed == {"alice": ["k1", "k3"], "bob": ["k2"], "carol": ["a:b"]}


def test_parse_api_keys_setting_blank_gives_empty() -> None:
    assert parse_api_keys_setting("") == {}
    assert parse_api_keys_setting("  ") == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("alice", "no ':'"),
        ("alice:k1,bob", "entry 2 has no ':'"),
        (":k1", "empty tenant"),
        ("alice:", "empty key"),
        ("alice:k1,,bob:k2", "entry 2 is empty"),
        ("alice:k1,", "entry 2 is empty"),
        ("al ice:k1", "invalid tenant"),
        ("alice:k 1", "whitespace"),
        ("alice:same,bob:same", "already given to tenant 'alice'"),
    ],
)
def test_parse_api_keys_setting_malformed_raises(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_api_keys_setting(value)


def test_parse_api_keys_setting_error_does_not_leak_key() -> None:
    with pytest.raises(ValueError) as info:
        parse_api_keys_setting("alice:secretkey123,bob:secretkey123")
    assert "secretkey123" not in str(info.value)


@pytest.mark.parametrize(
    ("header", "query", "expected"),
    [
        ("Bearer rg_abc", None, "rg_abc"),
        ("bearer   rg_abc ", None, "rg_abc"),
        ("token rg_abc", None, "rg_abc"),
        ("TOKEN rg_abc", None, "rg_abc"),
        (None, "rg_q", "rg_q"),
        ("Bearer rg_h", "rg_q", "rg_h"),
        ("Basic dXNlcjpwYXNz", None, None),
        ("Basic dXNlcjpwYXNz", "rg_q", "rg_q"),
        ("Bearer", None, None),
        ("Bearer ", "", None),
        ("", "  ", None),
        (None, None, None),
    ],
)
def test_extract_token_reads_header_or_query(
    header: str | None, query: str | None, expected: str | None
) -> None:
    assert extract_token(header, query) == expected
