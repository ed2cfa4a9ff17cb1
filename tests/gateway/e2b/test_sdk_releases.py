"""Older releases of E2B's SDKs, unmodified and with their defaults, against a gateway.

The releases: the oldest 2.x that E2B's three environment variables can point at a server
(2.7.0, Python and JS: before it the SDKs reach sandboxes only at ``https://PORT-ID.DOMAIN``, see
docs/e2b.md), 2.45.1 (Python; 2.45.0 in JS, which has no 2.45.1), the one E2B's own core test
suite is written for, and the newest (``test_python_sdk.py``, ``test_js_sdk.py``). Those send
``allow_internet_access: true``, ``secure`` and ``autoPause: false`` on every create, and
2.45 checks the key's shape on the client side. Each Python release gets a virtualenv of its own
(it cannot share ``.venv`` with the newest), installed from its hashed requirements file in
``sdks/``; the JS releases are npm aliases in ``js/package.json``. The gateway's key is the one
``replgate serve`` issues on its first start.
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
import pytest

from tests.conftest import REPO, GatewayProcess, running_gateway

HERE = Path(__file__).parent
SDKS = HERE / "sdks"
JS = HERE / "js"
UV = REPO / ".tools" / "bin" / "uv"


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
    ("2.45.1", ["core", "interpreter"]),
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
