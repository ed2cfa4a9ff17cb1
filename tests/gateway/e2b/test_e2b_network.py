"""E2B's network options through the unmodified SDK: ``allow_internet_access``,
``network={"allow_out", "deny_out"}`` and ``update_network`` on a session's network policy.

The gateway's ``open`` profile lets a session open the network (``network_max``); the host the
sandbox reaches is a real HTTP server in a network namespace made for the test.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from e2b import Sandbox, SandboxException

from tests.conftest import GatewayProcess, running_gateway
from tests.netns import NetnsHost, netns_host

ALLOWED, OTHER = 18280, 18281

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow" }
"""

FETCH = ("python3 -c \"import sys, urllib.request as u\n"
         "try: print(u.urlopen(sys.argv[1], timeout=10).read().decode())\n"
         "except Exception as exc: print('refused', exc)\" ")

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def host() -> Iterator[NetnsHost]:
    with netns_host((ALLOWED, OTHER)) as made:
        yield made


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    policy = Path(tempfile.mkdtemp(prefix="rg-e2bnp-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY)
    with running_gateway(docker_client, policy_file=str(policy), min_idle="0") as process:
        yield process


def fetch(sandbox: Sandbox, url: str) -> str:
    return sandbox.commands.run(FETCH + url, timeout=90).stdout.strip()


def test_deny_all_with_allow_out_reaches_only_the_allowed_host(host: NetnsHost) -> None:
    allowed = f"{host.address}:{ALLOWED}"
    with Sandbox.create(template="open", network={"deny_out": ["0.0.0.0/0"],
                                                  "allow_out": [allowed]}) as sandbox:
        assert fetch(sandbox, host.url(ALLOWED, "/e2b")) == f"hello {ALLOWED} /e2b"
        assert fetch(sandbox, host.url(OTHER)).startswith("refused HTTP Error 403")
        info = sandbox.get_info()
        assert info.allow_internet_access is False
        assert info.network is not None
        assert info.network["allow_out"] == [allowed]
        assert info.network["deny_out"] == ["0.0.0.0/0"]


def test_update_network_replaces_the_egress_of_a_running_sandbox(host: NetnsHost) -> None:
    with Sandbox.create(template="open", allow_internet_access=False) as sandbox:
        assert fetch(sandbox, host.url(ALLOWED)).startswith("refused HTTP Error 403")
        sandbox.update_network({"deny_out": [f"{host.address}/32:{OTHER}"]})
        assert fetch(sandbox, host.url(ALLOWED)) == f"hello {ALLOWED} /"
        assert fetch(sandbox, host.url(OTHER)).startswith("refused HTTP Error 403")
        assert sandbox.get_info().allow_internet_access is True


def test_the_internet_on_a_closed_profile_is_the_profiles_network_and_a_list_is_a_403(
        host: NetnsHost) -> None:
    with Sandbox.create(allow_internet_access=True) as sandbox:  # "base": the default profile
        assert sandbox.get_info().allow_internet_access is False
    with pytest.raises(SandboxException, match=r"beyond what this profile allows"):
        Sandbox.create(network={"deny_out": ["0.0.0.0/0"],
                                "allow_out": [f"{host.address}:{ALLOWED}"]})
