"""API keys in the gateway: the first start's key, and where a request carries its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.settings import Settings
from gateway.app import ensure_api_keys
from gateway.auth import extract_token
from gateway.store import Store
from tests.common.test_keys import E2B_KEY_FORMAT


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
