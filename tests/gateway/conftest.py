"""Fixtures of the gateway's HTTP tests: tenant alpha's client on the shared gateway, a session."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import CLIENT_TIMEOUT_S, GatewayProcess


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("alpha"),
                      timeout=CLIENT_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def session_id(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/v1/sessions", json={"metadata": {"purpose": "api tests"}})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/v1/sessions/{answer.json()['id']}")
