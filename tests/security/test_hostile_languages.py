"""Hostile code in R, JavaScript (Deno), Java and bash: a few cases per language, on the default
image (named by its old name, ``polyglot``).

The same limits as ``test_hostile_code.py``'s gateway (512 MiB, 128 processes), and the same
verdicts from outside: the answer's status within its time limit, the sandbox's pids cgroup,
the session usable afterwards in that language and in Python. A context's kernel runs in the
session's own container, so every rule of the sandbox holds for it: no network, a read-only
system, the pids limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from kernel_pool.backends.docker import build_image
from tests.conftest import containers_of, make_gateway
from tests.security.conftest import GRACE_S, LIMITS, RESTART_BUDGET_S, Hostile, brief

LANGUAGES = ["r", "javascript", "bash", "java"]
LOOPS = {"r": "repeat {}", "javascript": "while (true) {}", "bash": "while :; do :; done",
         "java": "while (true) {}"}
BOMB = "b(){ b|b& }; b"
BOMBS = {
    "r": f"system('{BOMB}')\nSys.sleep(3)",
    "javascript": (f"new Deno.Command('sh', {{args: ['-c', '{BOMB}']}}).spawn();\n"
                   "await new Promise((done) => setTimeout(done, 3000))"),
    "bash": ":(){ :|:& };:\nsleep 3",
    "java": f'new ProcessBuilder("sh", "-c", "{BOMB}").start();\nThread.sleep(3000);',
}
OUTSIDE = {  # each prints 'refused' and the reason when the write fails
    "r": ("tryCatch(writeLines('x', '/usr/evil'), warning = function(w) cat('refused',"
          " conditionMessage(w)), error = function(e) cat('refused', conditionMessage(e)))"),
    "javascript": ("try { Deno.writeTextFileSync('/usr/evil', 'x') }"
                   " catch (e) { console.log('refused', e.name) }"),
    "bash": "echo x > /usr/evil || echo refused",
    "java": ('try { java.nio.file.Files.writeString(java.nio.file.Path.of("/usr/evil"), "x"); }'
             ' catch (java.io.IOException e) { System.out.println("refused " + e); }'),
}
NETWORK = {  # each prints 'unreachable' when no connection can be made
    "r": ("tryCatch(readLines(url('http://1.1.1.1/'), warn = FALSE), warning = function(w)"
          " cat('unreachable', conditionMessage(w)), error = function(e) cat('unreachable',"
          " conditionMessage(e)))"),
    "javascript": ("await fetch('http://1.1.1.1/').then(() => console.log('reached'),"
                   " (e) => console.log('unreachable', e.name))"),
    "bash": "(exec 3<>/dev/tcp/1.1.1.1/80) 2>/dev/null && echo reached || echo unreachable",
    "java": ("try (var s = new java.net.Socket()) {"
             ' s.connect(new java.net.InetSocketAddress("1.1.1.1", 80), 3000);'
             ' System.out.println("reached"); }'
             ' catch (java.io.IOException e) { System.out.println("unreachable " + e); }'),
}
CHECKS = {"r": "cat(6 * 7)", "javascript": "console.log(6 * 7)", "bash": "echo $((6 * 7))",
          "java": "System.out.print(6 * 7);"}


@pytest.fixture(scope="module")
def polyglot(docker_client: docker.DockerClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """A gateway of the default image with the hostile suite's limits."""
    build_image(docker_client, state_dir=tmp_path_factory.mktemp("images"), log=lambda _: None)
    gateway = make_gateway(**LIMITS, image="polyglot", max_kernels="4", min_idle="1",
                           interrupt_grace_s=str(GRACE_S))
    gateway.start()
    attack = Hostile(gateway, docker_client, host_canary="unused")
    try:
        yield attack
    finally:
        for client in attack.clients.values():
            client.close()
        gateway.stop()
        left = containers_of(docker_client, gateway.owner)
        for cid in left:
            docker_client.api.remove_container(cid, force=True)
        assert not left, f"the polyglot gateway left containers behind: {left}"


@pytest.fixture(scope="module")
def sessions(polyglot: Hostile) -> Iterator[dict[str, str]]:
    made: dict[str, str] = {}
    yield made
    for session_id in made.values():
        polyglot.delete(session_id)


@pytest.fixture
def sid(polyglot: Hostile, sessions: dict[str, str], language: str) -> str:
    """One session for the module, Java's apart: each case must leave it usable for the next.
    Idle, Python's, R's, Deno's and bash's kernels hold about 420 MiB of the 512 MiB the
    hostile suite gives a sandbox, and Java's JVM about 90 MiB more (docs/languages.md)."""
    key = "java" if language == "java" else "others"
    if key not in sessions:
        sessions[key] = polyglot.new_session()
    return sessions[key]


def run(hostile: Hostile, sid: str, code: str, language: str,
        timeout_s: float = 30) -> dict[str, Any]:
    started = time.monotonic()
    answer = hostile.client().post(f"/v1/sessions/{sid}/execute", json={
        "code": code, "language": language, "timeout_s": timeout_s})
    elapsed = time.monotonic() - started
    assert answer.status_code == 200, answer.text[:2000]
    result: dict[str, Any] = answer.json()
    assert elapsed < timeout_s + GRACE_S + RESTART_BUDGET_S, (elapsed, brief(result))
    assert result["language"] == language, brief(result)
    return result


def usable(hostile: Hostile, sid: str, language: str) -> None:
    """The language's context and Python's answer correctly."""
    result = run(hostile, sid, CHECKS[language], language)
    assert (result["status"], result["stdout"].strip()) == ("ok", "42"), brief(result)
    hostile.usable(sid)


FORK_RETRY = re.compile(r"bash: |fork: |retry: |Resource temporarily unavailable")
"""The pieces of bash's message for a fork refused at the pids limit."""

@pytest.mark.parametrize("language", LANGUAGES)
def test_infinite_loop_ends_at_its_timeout(polyglot: Hostile, sid: str, language: str) -> None:
    result = run(polyglot, sid, LOOPS[language], language, timeout_s=2)
    assert result["status"] == "timeout", brief(result)
    assert "timeout_s=2" in (result["reason"] or "")
    usable(polyglot, sid, language)


@pytest.mark.parametrize("language", LANGUAGES)
def test_fork_bomb_stays_under_the_pids_limit(polyglot: Hostile, sid: str,
                                              language: str) -> None:
    result = run(polyglot, sid, BOMBS[language], language, timeout_s=10)
    assert result["status"] in ("ok", "error", "timeout", "died"), brief(result)
    assert polyglot.pids_limit(sid) == 128
    assert polyglot.pids_current(sid) <= 128
    # Nothing of the bomb outlives its execution: the session forks again at once.
    assert not [c for c in polyglot.host_processes(sid) if "b|b&" in c or ":|:&" in c]
    # The next code runs. Bash may first complain of background jobs it can no longer wait
    # for (killed from outside: "wait_for: No record of process N"), a status error once. A
    # bomb's last processes, killed after the execution by the session (they had left the
    # shell: orphans), may have written "bash: fork: retry: Resource temporarily unavailable"
    # to the shell's terminal as they died, in several writes that the answer's own line can
    # fall between ("bash: fork: retry: 42"); only such pieces may come before the answer.
    after = run(polyglot, sid, CHECKS[language], language)
    lines = [FORK_RETRY.sub("", line).strip() for line in after["stdout"].splitlines()]
    assert [line for line in lines if line][:1] == ["42"], brief(after)
    usable(polyglot, sid, language)


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_file_outside_the_workspace_is_refused(polyglot: Hostile, sid: str,
                                                 language: str) -> None:
    result = run(polyglot, sid, OUTSIDE[language], language)
    assert "refused" in result["stdout"], brief(result)
    listing = polyglot.container(sid).exec_run(["ls", "/usr/evil"])
    assert listing.exit_code != 0, listing.output


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_network_is_unreachable(polyglot: Hostile, sid: str, language: str) -> None:
    result = run(polyglot, sid, NETWORK[language], language, timeout_s=20)
    assert result["stdout"].startswith("unreachable"), brief(result)
