"""A running gateway and E2B's three environment variables pointing at it (tenant alpha)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import GatewayProcess


@pytest.fixture(scope="module")
def e2b_env(gateway: GatewayProcess) -> Iterator[dict[str, str]]:
    """``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` set, as a user sets them."""
    env = {"E2B_API_URL": f"{gateway.url}/e2b", "E2B_SANDBOX_URL": f"{gateway.url}/e2b/sandbox",
           "E2B_API_KEY": gateway.keys["alpha"]}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    yield env
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
