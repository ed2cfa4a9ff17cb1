"""The contract suite's fixtures: a host of each kind (:mod:`tests.contract.support`), one per
module and leg (a package-scoped one would live to the end of the whole run: tests/ is the
package), and a session of each test's own. Tests take a :class:`SessionHost` and a
:class:`SessionPort` and never ask which one they have."""

from __future__ import annotations

from collections.abc import AsyncIterator

import docker
import pytest

from kernel_pool import SessionHost, SessionPort
from tests.contract.support import SESSION_ENV, local_host, remote_host


@pytest.fixture(scope="module", params=["local", "remote"])
async def host(request: pytest.FixtureRequest,
               docker_client: docker.DockerClient) -> AsyncIterator[SessionHost]:
    """Where sessions are made: this process's pool, or a node reached over the network."""
    started = local_host if request.param == "local" else remote_host
    async for made in started(docker_client):
        yield made


@pytest.fixture
async def session(host: SessionHost) -> AsyncIterator[SessionPort]:
    """A session of the test's own (``SESSION_ENV`` in its environment), deleted after it."""
    made = await host.create_session(env=dict(SESSION_ENV))
    yield made
    if not made.closed:
        await host.delete_session(made.id)
