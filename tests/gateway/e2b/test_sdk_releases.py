"""Older releases of E2B's SDKs, unmodified and with their defaults, against a gateway.

The releases: the oldest 2.x (2.0.0, Python; 2.0.1, JS), which reaches a server only at E2B's
host names (``https://api.DOMAIN``, ``https://PORT-ID.DOMAIN``; docs/e2b.md) served by a gateway
with ``REPLGATE_E2B_DOMAIN``; the oldest 2.x that E2B's three environment variables can point at a
server (2.7.0, Python and JS); 2.45.1 (Python; 2.45.0 in JS, which has no 2.45.1), the one
E2B's own core test suite is written for; and the newest (``test_python_sdk.py``,
``test_js_sdk.py``). Those send ``allow_internet_access: true``, ``secure`` and ``autoPause:
false`` on every create, and 2.45 checks the key's shape on the client side. Each Python release
gets a virtualenv of its own (it cannot share ``.venv`` with the newest), installed from its
hashed requirements file in ``sdks/``; the JS releases are npm aliases in ``js/package.json``.
The gateway's key is the one ``replgate serve`` issues on its first start (the host-name
tests' gateway has configured keys: 2.0.0 checks no key's shape).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.conftest import REPO, GatewayProcess, running_gateway
from tests.gateway.e2b.wildcard import (
    DNS_VARIABLE,
    install_wildcard_dns,
    make_certificates,
    tls_front,
)

HERE = Path(__file__).parent
SDKS = HERE / "sdks"
JS = HERE / "js"
UV = REPO / ".tools" / "bin" / "uv"
DOMAIN = "e2b.replgate.test"
"""E2B_DOMAIN and REPLGATE_E2B_DOMAIN of the host-name tests (``.test`` is never a real one)."""


@pytest.fixture(scope="module")
def issued(docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """A gateway with no configured keys, so it issues one, as on a user's first start, and
    E2B's three variables pointing at it with that key."""
    with running_gateway(docker_client, api_keys="") as gateway:
        yield _e2b_env(gateway, (gateway.state_dir / "api_key").read_text().strip())


def _e2b_env(gateway: GatewayProcess, key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    return {**env, "E2B_API_URL": f"{gateway.url}/e2b",
            "E2B_SANDBOX_URL": f"{gateway.url}/e2b/sandbox", "E2B_API_KEY": key}


@pytest.fixture(scope="session")
def release_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """A fresh virtualenv per Python release, from its hashed requirements, made once."""
    made: dict[str, Path] = {}

    def python(release: str) -> Path:
        if release not in made:
            if not UV.is_file():
                pytest.fail(f"{UV} is missing; ./run.sh test installs it")
            venv = tmp_path_factory.mktemp(f"e2b-{release}")
            subprocess.run([UV, "venv", "-q", "--python", sys.executable, venv], check=True)
            subprocess.run([UV, "pip", "install", "-q", "--require-hashes", "--no-deps",
                            "-r", SDKS / f"e2b-{release}.txt"], check=True,
                           env={**os.environ, "VIRTUAL_ENV": str(venv)})
            made[release] = venv / "bin" / "python"
        return made[release]

    yield python


@pytest.mark.parametrize(("release", "parts"), [
    # No e2b-code-interpreter that installs beside e2b 2.7.0 reaches a server through
    # E2B_SANDBOX_URL (it does from 2.9.0, which needs e2b 2.26): the core SDK alone.
    ("2.7.0", ["core"]),
    ("2.45.1", ["core", "interpreter", "killed"]),
])
def test_python_release_creates_runs_lists_and_kills_with_its_defaults(
        release: str, parts: list[str], release_python: Callable[[str], Path],
        issued: dict[str, str]) -> None:
    run = subprocess.run([release_python(release), SDKS / "drive.py", *parts], env=issued,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout)
    assert seen.pop("e2b") == release
    assert seen.pop("run_code", "42") == "42"
    seen.pop("e2b-code-interpreter", None)
    if "killed" in parts:  # before 2.63 the SDK says the server's own text, unchecked
        killed = seen.pop("killed_mid_command")
        assert killed.startswith("TimeoutException: ") and (
            "sandbox was killed or reached its end of life" in killed), killed
    assert seen == {"command": "ok\n", "file": "written", "running": True, "listed": True,
                    "running_after_kill": False}


@pytest.mark.parametrize(("alias", "release"), [("e2b-2-7", "2.7.0"), ("e2b-2-45", "2.45.0")])
def test_js_release_creates_runs_lists_and_kills_with_its_defaults(
        alias: str, release: str, issued: dict[str, str]) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; ./run.sh test installs Debian's nodejs")
    if not (JS / "node_modules" / alias).is_dir():
        pytest.fail(f"{alias} is not installed; run: npm ci --prefix {JS}")
    run = subprocess.run([node, "releases.mjs", alias], cwd=JS, env=issued,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert json.loads(run.stdout) == {"version": release, "command": "ok\n", "file": "written",
                                      "running": True, "listed": True, "runningAfterKill": False}


@pytest.fixture(scope="module")
def hosts_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    """A gateway answering E2B's host names under :data:`DOMAIN`."""
    with running_gateway(docker_client, e2b_domain=DOMAIN) as gateway:
        yield gateway


def test_e2b_host_names_reach_the_api_and_a_sandbox_port(hosts_gateway: GatewayProcess) -> None:
    """``api.DOMAIN`` is ``/e2b``, ``PORT-ID.DOMAIN`` that sandbox's port (whatever its
    headers say); other names under the domain are E2B's 404, other hosts untouched."""
    api = {"Host": f"api.{DOMAIN}", "X-API-Key": hosts_gateway.keys["alpha"]}
    with httpx.Client(base_url=hosts_gateway.url, timeout=60) as client:
        created = client.post("/sandboxes", headers=api, json={"templateID": "base"})
        assert created.status_code == 201, created.text
        sandbox = created.json()
        assert sandbox["domain"] == DOMAIN
        sandbox_id = sandbox["sandboxID"]
        try:
            envd = {"Host": f"49983-{sandbox_id}.{DOMAIN}:443",
                    "X-Access-Token": sandbox["envdAccessToken"],
                    "E2b-Sandbox-Id": "another", "E2b-Sandbox-Port": "1"}
            wrote = client.post("/files", params={"path": "/home/user/h.txt"}, headers=envd,
                                content=b"by host")
            assert wrote.status_code == 200, wrote.text
            read = client.get("/files", params={"path": "/home/user/h.txt"}, headers=envd)
            assert read.content == b"by host"
            assert client.get(f"/sandboxes/{sandbox_id}", headers=api).json()["domain"] == DOMAIN
            closed = client.get("/files", params={"path": "/home/user/h.txt"},
                                headers={**envd, "Host": f"8080-{sandbox_id}.{DOMAIN}"})
            assert closed.status_code == 502
            assert "port 8080" in closed.json()["message"]
            for other in (f"www.{DOMAIN}", DOMAIN, f"x-{sandbox_id}.{DOMAIN}"):
                stray = client.get("/sandboxes", headers={**api, "Host": other})
                assert stray.status_code == 404
                assert stray.json() == {"code": 404, "message": stray.json()["message"]}
                assert f"api.{DOMAIN}" in stray.json()["message"]
            # Not under the domain: replgate's own paths, not rewritten.
            plain = {"X-API-Key": hosts_gateway.keys["alpha"]}
            assert client.get("/sandboxes", headers=plain).status_code == 404
            assert client.get("/e2b/sandboxes", headers=plain).status_code == 200
        finally:
            assert client.delete(f"/sandboxes/{sandbox_id}", headers=api).status_code == 204


def test_python_2_0_reaches_the_gateway_at_e2b_host_names(
        release_python: Callable[[str], Path], hosts_gateway: GatewayProcess,
        tmp_path: Path) -> None:
    """``e2b`` 2.0.0 knows no ``E2B_API_URL`` nor ``E2B_SANDBOX_URL``: given ``E2B_DOMAIN``,
    it creates, runs a command, writes and reads a file, lists and kills at
    ``https://api.DOMAIN`` and ``https://49983-ID.DOMAIN``, on port 443.

    What a deployment provides is stood in for: the wildcard certificate and the TLS proxy
    holding it (Caddy, nginx) by :func:`~tests.gateway.e2b.wildcard.tls_front` with a CA this
    test makes, which the SDK trusts through ``SSL_CERT_FILE`` (its httpx 0.28 honours it); the
    ``*.DOMAIN`` DNS record by a ``sitecustomize.py`` in the SDK's virtualenv resolving the
    domain's names to the proxy's loopback address. Nothing else points the SDK anywhere."""
    python = release_python("2.0.0")
    install_wildcard_dns(python)
    ca, cert, key = make_certificates(DOMAIN, tmp_path)
    with tls_front(cert, key, _port(hosts_gateway)) as address:
        env = {**_domain_env(hosts_gateway, address), "SSL_CERT_FILE": str(ca)}
        run = subprocess.run([python, SDKS / "drive.py", "core"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout) == {
        "e2b": "2.0.0", "command": "ok\n", "file": "written", "running": True, "listed": True,
        "running_after_kill": False}


def test_js_2_0_reaches_the_gateway_at_e2b_host_names(
        hosts_gateway: GatewayProcess, tmp_path: Path) -> None:
    """The JS ``e2b`` 2.0.1 (the oldest 2.x on npm), as the Python test above: the CA trusted
    through ``NODE_EXTRA_CA_CERTS``, and the DNS record stood in for by ``js/wildcard-dns.cjs``
    (``node --require``), which resolves the domain's names to the proxy's address."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; ./run.sh test installs Debian's nodejs")
    if not (JS / "node_modules" / "e2b-2-0").is_dir():
        pytest.fail(f"e2b-2-0 is not installed; run: npm ci --prefix {JS}")
    ca, cert, key = make_certificates(DOMAIN, tmp_path)
    with tls_front(cert, key, _port(hosts_gateway)) as address:
        env = {**_domain_env(hosts_gateway, address), "NODE_EXTRA_CA_CERTS": str(ca),
               "NODE_OPTIONS": f"--require {JS / 'wildcard-dns.cjs'}"}
        run = subprocess.run([node, "releases.mjs", "e2b-2-0"], cwd=JS, env=env,
                             capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert json.loads(run.stdout) == {"version": "2.0.1", "command": "ok\n", "file": "written",
                                      "running": True, "listed": True, "runningAfterKill": False}


def _port(gateway: GatewayProcess) -> int:
    return int(gateway.url.rsplit(":", 1)[1])


def _domain_env(gateway: GatewayProcess, address: str) -> dict[str, str]:
    """What a user of a release before 2.7 sets (``E2B_DOMAIN``, ``E2B_API_KEY``), and the DNS
    stand-in's address; no proxy nor certificate settings of the test's own environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("E2B_") and not k.lower().endswith("_proxy")
           and k not in ("SSL_CERT_DIR", "SSL_CERT_FILE", "NODE_OPTIONS", "NODE_EXTRA_CA_CERTS")}
    return {**env, "E2B_DOMAIN": DOMAIN, "E2B_API_KEY": gateway.keys["alpha"],
            DNS_VARIABLE: f"{DOMAIN}={address}"}
