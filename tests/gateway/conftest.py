"""Fixtures shared by the gateway's tests (the gateway process itself is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import GatewayProcess


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    """An HTTP client of tenant ``alpha`` on the shared gateway."""
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("alpha"), timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def alpha_session(alpha: httpx.Client) -> Iterator[str]:
    """A session of tenant ``alpha`` for the module, with ``SESSION_VAR`` in its environment."""
    answer = alpha.post("/v1/sessions", json={"env": {"SESSION_VAR": "from-session"}})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/v1/sessions/{answer.json()['id']}")
