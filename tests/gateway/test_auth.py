"""API key helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from common.keys import generate_api_key, hash_api_key, parse_api_keys_setting
from common.settings import Settings
from gateway.app import ensure_api_keys
from gateway.auth import extract_token
from gateway.store import Store

E2B_KEY_FORMAT = re.compile(r"\Ae2b_[0-9a-f]+\Z")
"""What E2B's SDKs accept on the client side (e2b 2.45.1's ``_API_KEY_PATTERN`` for Python,
``/^e2b_[0-9a-f]+$/`` in e2b 2.45.0 for JS; the oldest 2.x and the newest check nothing)."""


def test_generate_api_key_is_e2b_shaped_and_unique() -> None:
    keys = {generate_api_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert E2B_KEY_FORMAT.match(key), key
        assert len(key) == 4 + 64  # 256 bits


async def test_first_start_issues_an_e2b_shaped_key(tmp_path: Path,
                                                     database_target: str | Path) -> None:
    settings = Settings(state_dir=tmp_path, api_keys=None)
    async with Store.open(database_target) as store:
        await ensure_api_keys(settings, store)
        key = (tmp_path / "api_key").read_text().strip()
        assert E2B_KEY_FORMAT.match(key), key
        assert await store.tenant_for_key(key) == "default"


async def test_a_key_made_before_keeps_authenticating(tmp_path: Path,
                                                      database_target: str | Path) -> None:
    old = "rg_" + "Ab-_" * 10 + "xyz"  # the shape keys had before they were E2B's
    (tmp_path / "api_key").write_text(old + "\n")
    settings = Settings(state_dir=tmp_path, api_keys=None)
    async with Store.open(database_target) as store:
        await ensure_api_keys(settings, store)
        assert await store.tenant_for_key(old) == "default"
    assert (tmp_path / "api_key").read_text() == old + "\n"


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
