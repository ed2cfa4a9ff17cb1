"""The kernel's side of the session's environment: the gateway's file applied when it changed,
only what changed in it, and a file the sandbox spoiled ignored."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from replgate_kernel.session_env import ENV_FILE, SessionEnv

NAMES = ("RG_TEST_A", "RG_TEST_B")


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    yield
    for name in NAMES:
        os.environ.pop(name, None)


def write(path: Path, env: object) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps(env))
    os.replace(staged, path)  # as the gateway does: a new file renamed in


def test_applies_the_file_once_and_then_only_what_changed(tmp_path: Path) -> None:
    path = tmp_path / ENV_FILE
    env = SessionEnv(str(path))
    env.apply()  # no file yet: nothing
    assert "RG_TEST_A" not in os.environ
    write(path, {"RG_TEST_A": "1", "RG_TEST_B": "x"})
    env.apply()
    assert (os.environ["RG_TEST_A"], os.environ["RG_TEST_B"]) == ("1", "x")
    os.environ["RG_TEST_A"] = "set by the code"
    env.apply()  # unchanged file: not read again
    assert os.environ["RG_TEST_A"] == "set by the code"
    write(path, {"RG_TEST_A": "1", "RG_TEST_B": "y"})
    env.apply()
    assert (os.environ["RG_TEST_A"], os.environ["RG_TEST_B"]) == ("set by the code", "y")


def test_a_spoiled_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / ENV_FILE
    env = SessionEnv(str(path))
    path.write_text("{not json")
    env.apply()
    write(path, ["RG_TEST_A", "1"])
    env.apply()
    write(path, {"RG_TEST_A": 1, "RG_TEST_B": "ok"})
    env.apply()
    assert "RG_TEST_A" not in os.environ and os.environ["RG_TEST_B"] == "ok"
