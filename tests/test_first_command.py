"""The README's first command, run as a new user runs it: in a fresh clone, with a new virtualenv.

``tests/test_readme.py`` runs the README's examples in the test suite's own virtualenv, which is
how a first command that failed at import once hid behind a green suite. Here the repository is
cloned into a folder of its own, ``./run.sh serve`` runs there exactly as the README writes it
(its own ``.venv`` and ``.tools``, installed from the lock; the engine and the image already on
the machine are reused, as they are on a user's machine after the first run), and the README's
first Python example runs with the clone's interpreter against it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.conftest import REPO
from tests.test_readme import BLOCKS, PORT

FIRST_COMMAND = "./run.sh serve"
INSTALL_AND_START_S = 600.0
"""A new virtualenv from the lock (uv's cache warm or not) and the gateway's start."""


def owned_containers(client: docker.DockerClient, owner: str) -> list[str]:
    # One listing, no inspection of each (a container removed in between would fail it).
    return [entry["Names"][0].lstrip("/") for entry in client.api.containers(
        all=True, filters={"label": f"io.replgate.owner={owner}"})]


@pytest.fixture(scope="module")
def clone() -> Iterator[Path]:
    """The repository as committed (HEAD), cloned as a new user would have it."""
    folder = Path(tempfile.mkdtemp(prefix="rgclone-", dir="/tmp"))
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(folder / "r")],
                   check=True, timeout=120)
    yield folder / "r"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def served(clone: Path, docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """``./run.sh serve`` in the clone, stopped (SIGTERM, as Ctrl-C would) at the end."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", PORT))
        except OSError as exc:
            pytest.fail(f"port {PORT} is taken ({exc.strerror}); the README's first command "
                        "serves there, so stop what listens on it and run this test again")
    home = clone.parent / "home"
    home.mkdir()
    owner = f"test-first-{secrets.token_hex(4)}"
    # A new user's environment: none of this run's REPLGATE_* settings, a HOME of its own (so the
    # default state folder and key are the clone's). uv's download cache is the machine's: where
    # wheels are cached changes nothing that is installed, and spares the network.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REPLGATE_", "VIRTUAL_ENV", "UV_"))}
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "uv"
    env.update({"HOME": str(home), "UV_CACHE_DIR": str(cache), "REPLGATE_OWNER": owner,
                "REPLGATE_KEEP_SESSIONS_ON_STOP": "false"})
    log_path = clone.parent / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(FIRST_COMMAND.split(), cwd=clone, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + INSTALL_AND_START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"{FIRST_COMMAND} exited ({process.returncode}):\n"
                            f"{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{FIRST_COMMAND} did not answer /healthz in {INSTALL_AND_START_S} s:"
                            f"\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for name in owned_containers(docker_client, owner):
            docker_client.containers.get(name).remove(force=True)


def test_first_command_serves_with_a_new_virtualenv_from_the_lock(
        clone: Path, served: dict[str, str]) -> None:
    assert (clone / ".venv" / "bin" / "python").is_file()
    assert (clone / ".tools" / "bin" / "uv").is_file()
    done = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                           "import connectrpc, gateway.e2b, replgate; print(replgate.Sandbox)"],
                          capture_output=True, text=True, env=served, timeout=60)
    assert done.returncode == 0, done.stderr
    frozen = subprocess.run([str(clone / ".tools" / "bin" / "uv"), "pip", "freeze",
                             "--python", str(clone / ".venv" / "bin" / "python")],
                            capture_output=True, text=True, env=served, timeout=60, check=True)
    ours = subprocess.run([str(REPO / ".tools" / "bin" / "uv"), "pip", "freeze",
                           "--python", str(REPO / ".venv" / "bin" / "python")],
                          capture_output=True, text=True, timeout=60, check=True)
    mine = {line for line in ours.stdout.splitlines() if "==" in line}
    theirs = {line for line in frozen.stdout.splitlines() if "==" in line}
    # The same lock: every package the serve install has, the test install has at that version.
    assert theirs and theirs <= mine, sorted(theirs - mine)


def test_readme_python_example_runs_with_the_clones_interpreter(
        clone: Path, served: dict[str, str]) -> None:
    example = next(b for b in BLOCKS if b.language == "python")
    done = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", example.text],
                          cwd=clone, env=served, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (
        f"{example} failed with the clone's .venv/bin/python (exit {done.returncode}):\n"
        f"{example.text}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
