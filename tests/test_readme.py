"""README.md's examples, and those of the pages in docs/, run as written against a running
gateway, so they cannot rot.

Every fenced block is accounted for: shell and Python blocks run (the set-up commands
``./run.sh ...`` excepted), JSON blocks parse, TOML blocks load as a policy. A block that cannot
run says so in the README itself, on the line just above it, with its reason (MARK). The gateway
is what the README promises a user gets: ``replgate serve`` on 127.0.0.1:8000 with its default
state directory and key (under a HOME of its own here), so ``~/.local/state/replgate/api_key``
and ``localhost:8000`` in the examples mean what they say.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from common.policy import load_policy
from tests.conftest import REPO, GatewayProcess, running_gateway

README = REPO / "README.md"
MEASUREMENTS = {"benchmarks.md", "checkpoint.md"}
"""Pages whose blocks are the commands and outputs of measurements (minutes each), not examples."""
PAGES = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in MEASUREMENTS)]
PORT = 8000
MARK = re.compile(r"^\*\(Not run by `tests/test_readme\.py`: (?P<reason>.{10,})\)\*$")
"""The visible line above a block that cannot run: ``*(Not run by `tests/test_readme.py`:
<reason>.)*``."""
SHELL = {"bash", "sh", "shell"}


@dataclass
class Block:
    page: Path
    language: str
    text: str
    line: int
    """Line number of the opening fence, for messages."""
    mark: str | None
    """The reason it is not run, when the README gives one."""

    def is_setup(self) -> bool:
        """Only ``./run.sh ...`` commands (each perhaps after ``NAME=value`` settings)."""
        commands = [line for line in self.text.splitlines() if line.strip()]
        return self.language in SHELL and all(
            re.match(r"^(\w+=\S* )*\./run\.sh ", c) for c in commands)

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)} line {self.line} ({self.language})"


def page_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        mark = MARK.match(before.strip())
        blocks.append(Block(page, fence.group(1), "\n".join(lines[index + 1:end]) + "\n",
                            index + 1, mark.group("reason") if mark else None))
        index = end + 1
    return blocks


BLOCKS = page_blocks(README)
"""The README's blocks, in order (the first is the set-up commands)."""
ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]
RUNNABLE = [b for b in ALL_BLOCKS if b.language in SHELL | {"python"} and not b.is_setup()
            and b.mark is None]


def test_readme_blocks_are_each_run_parsed_or_marked() -> None:
    assert [b for b in RUNNABLE if b.page == README], "README.md has no example to run"
    for block in ALL_BLOCKS:
        assert block.language, (
            f"{block}: a block needs a language (bash, python, json, toml, or text for a "
            "diagram, which is not checked)")
        assert block.language in SHELL | {"python", "json", "toml", "text"}, (
            f"{block}: the README test does not know how to check {block.language!r} blocks")
        if block.mark is not None:
            assert block.language in SHELL | {"python"} and not block.is_setup(), (
                f"{block}: only a shell or Python example can be marked as not run")


def test_readme_opens_with_the_two_setup_commands() -> None:
    first = BLOCKS[0]
    assert first.is_setup(), f"{first}: the README must open with the set-up commands"
    commands = [line.split("#")[0].split() for line in first.text.splitlines() if line.strip()]
    assert commands == [["./run.sh", "serve"], ["./run.sh", "test"]]


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "json"], ids=str)
def test_readme_json_block_parses(block: Block) -> None:
    json.loads(block.text)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "toml"], ids=str)
def test_readme_toml_block_loads_as_policy(block: Block, tmp_path: Path) -> None:
    tomllib.loads(block.text)
    policy = tmp_path / "policy.toml"
    policy.write_text(block.text)
    load_policy(policy)  # raises PolicyError naming the problem


@pytest.fixture(scope="module")
def home(docker_client: docker.DockerClient) -> Iterator[Path]:
    """A HOME whose ``replgate serve`` runs as the README's: default state dir and key, :8000."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as serve: TIME_WAIT is ok
        try:
            probe.bind(("127.0.0.1", PORT))
        except OSError as exc:
            pytest.fail(f"port {PORT} is taken ({exc.strerror}); the README's examples use it, "
                        "so stop what listens there and run this test again")
    home = Path(tempfile.mkdtemp(prefix="rgr-", dir="/tmp"))  # short: socket paths are short
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    env.update({"HOME": str(home), "REPLGATE_OWNER": f"test-{secrets.token_hex(4)}",
                "REPLGATE_MIN_IDLE": "1", "REPLGATE_MAX_KERNELS": "4",
                "REPLGATE_WORKSPACE_SIZE": "256m",
                # The examples leave sessions behind (the curl one does): a stop deletes them
                # here, so running_gateway can check that nothing is left running.
                "REPLGATE_KEEP_SESSIONS_ON_STOP": "false"})
    state_dir = home / ".local" / "state" / "replgate"
    process = GatewayProcess(url=f"http://127.0.0.1:{PORT}", state_dir=state_dir,
                             owner=env["REPLGATE_OWNER"], keys={}, env=env,
                             log_path=home.with_suffix(".log"))
    try:
        with running_gateway(docker_client, process):
            assert (state_dir / "api_key").is_file(), "serve made no key file"
            yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_readme_example_runs_as_written(block: Block, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLGATE_")}
    env["HOME"] = str(home)
    if block.language == "python":
        command = [sys.executable, "-c", block.text]
    else:  # strict: a failing command anywhere in the example fails it
        command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, (
        f"{block} failed (exit {done.returncode}):\n{block.text}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
