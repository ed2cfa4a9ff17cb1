"""``git`` in the default image, driven by the unmodified SDK's ``sandbox.git`` helpers: a
repository made, committed, pushed to a ``git daemon`` on the sandbox's loopback (no network
leaves the sandbox) and cloned back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


def test_the_sdks_git_helpers_init_commit_push_and_clone(sandbox: Sandbox) -> None:
    repo, remote, clone = "/home/user/repo", "/home/user/remote.git", "/home/user/clone"
    sandbox.git.init(repo, initial_branch="main")
    sandbox.git.configure_user("Sandbox Bot", "bot@example.com")
    assert sandbox.git.get_config("user.name", scope="global") == "Sandbox Bot"
    sandbox.files.write(f"{repo}/README.md", "hello\n")
    assert [f.name for f in sandbox.git.status(repo).file_status] == ["README.md"]
    sandbox.git.add(repo, all=True)
    sandbox.git.commit(repo, message="first")
    assert sandbox.git.status(repo).is_clean
    sandbox.git.create_branch(repo, "feature")
    assert sandbox.git.branches(repo).current_branch == "feature"

    sandbox.commands.run(f"git init --bare --initial-branch=main {remote}")
    daemon = sandbox.commands.run(
        "git daemon --reuseaddr --base-path=/home/user --export-all --enable=receive-pack "
        "--listen=127.0.0.1 --port=9418", background=True)
    try:
        sandbox.commands.run("sleep 1")
        url = "git://127.0.0.1:9418/remote.git"
        sandbox.git.remote_add(repo, "origin", url)
        sandbox.git.push(repo, remote="origin", branch="feature", set_upstream=True)
        sandbox.git.clone(url, clone, branch="feature")
        assert sandbox.files.read(f"{clone}/README.md") == "hello\n"
        log = sandbox.commands.run(f"git -C {clone} log -1 --pretty=%s").stdout.strip()
        assert log == "first"
    finally:
        daemon.kill()
