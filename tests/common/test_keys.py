"""API keys as both the gateway and the node make them (common.keys): made, hashed, read from the
settings."""

from __future__ import annotations

import re

import pytest

from common.keys import generate_api_key, hash_api_key, parse_api_keys_setting

E2B_KEY_FORMAT = re.compile(r"\Ae2b_[0-9a-f]+\Z")
"""What E2B's SDKs accept on the client side (e2b 2.45.1's ``_API_KEY_PATTERN`` for Python,
``/^e2b_[0-9a-f]+$/`` in e2b 2.45.0 for JS; the oldest 2.x and the newest check nothing)."""


def test_generate_api_key_is_e2b_shaped_and_unique() -> None:
    keys = {generate_api_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert E2B_KEY_FORMAT.match(key), key
        assert len(key) == 4 + 64  # 256 bits


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
