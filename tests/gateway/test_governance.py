"""Governance end to end: policy denials, human approvals, budgets and an egress profile.

A real ``replgate serve`` with a policy file and approver keys, real containers, and a real
HTTP server on the host's loopback as the one host the egress profile may reach.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.asyncio.client import connect

from common.policy import BUILTIN_RULES, load_policy
from gateway.governance import decide
from tests.conftest import GatewayProcess, make_gateway, running_gateway

APPROVAL_TIMEOUT_S = 6
ALICE = f"approver-alice-{secrets.token_hex(8)}"
BOB = f"approver-bob-{secrets.token_hex(8)}"

POLICY = """
[[rules]]
id = "no-system"
action = "deny"
calls = ["os.system"]
message = "os.system is not allowed here"

[[rules]]
id = "ask-first"
action = "approve"
strings = ["*needs-approval*"]
message = "a person must approve this"

[defaults]
rules = ["no-system", "builtin.subprocess", "ask-first"]

[profiles.counted]
min_idle = 0
[profiles.counted.budgets]
max_executions = 2

[profiles.timed]
min_idle = 0
[profiles.timed.budgets]
max_wall_time_s = 2

[profiles.egress]
min_idle = 0
egress_allow = ["127.0.0.1:{port}"]
"""


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the allowed host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def allowed_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def governed(docker_client: docker.DockerClient, allowed_port: int) -> Iterator[GatewayProcess]:
    policy = Path(tempfile.mkdtemp(prefix="rg-pol-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY.format(port=allowed_port))
    with running_gateway(docker_client, policy_file=str(policy),
                         approval_timeout_s=str(APPROVAL_TIMEOUT_S),
                         approver_keys=f"alpha:alice:{ALICE},beta:bob:{BOB}") as process:
        yield process


@pytest.fixture(scope="module")
def alpha(governed: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=governed.url, headers=governed.headers("alpha"), timeout=60) as c:
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def session_id(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    alpha.delete(f"/v1/sessions/{answer.json()['id']}")


def new_session(client: httpx.Client, profile: str) -> str:
    answer = client.post("/v1/sessions", json={"profile": profile})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["id"]
    return sid


def execute(client: httpx.Client, sid: str, code: str, **extra: Any) -> dict[str, Any]:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code, **extra})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def audit_extra(process: GatewayProcess, execution_id: str) -> dict[str, Any]:
    """The execution's audit ``extra`` (the record is appended just after the answer)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for record in reversed(process.audit_records()):
            if record["execution_id"] == execution_id:
                extra: dict[str, Any] = record["extra"]
                return extra
        time.sleep(0.1)
    raise AssertionError(f"no audit record for {execution_id}")


def wait_pending(client: httpx.Client, sid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pending = [a for a in client.get("/v1/approvals").json() if a["session_id"] == sid]
        if pending:
            return pending[0]
        time.sleep(0.05)
    raise AssertionError("no pending approval appeared")


def file_exists(client: httpx.Client, sid: str, path: str) -> bool:
    return client.get(f"/v1/sessions/{sid}/files/{path}").status_code == 200


# -- policy ---------------------------------------------------------------------------------------


def test_execute_denied_by_policy_never_runs(governed: GatewayProcess, alpha: httpx.Client,
                                            session_id: str) -> None:
    code = "open('denied.txt', 'w').write('ran')\nimport os\nos.system('true')"
    result = execute(alpha, session_id, code)
    assert result["status"] == "denied"
    assert result["error"]["ename"] == "PolicyDenied"
    assert "rule no-system matched line 3 (call os.system)" in result["error"]["evalue"]
    assert not file_exists(alpha, session_id, "denied.txt")
    history = alpha.get(f"/v1/sessions/{session_id}/executions").json()
    assert history[-1]["status"] == "denied"
    extra = audit_extra(governed, result["id"])
    assert extra["policy"]["decision"] == "deny"
    assert {m["rule"] for m in extra["policy"]["rules"]} == {"no-system", "builtin.subprocess"}


@pytest.mark.parametrize("code", [
    "import subprocess as sp\nsp.run(['true'])",
    "from os import system as s\ns('true')",
    "import os\ngetattr(os, 'system')('true')",
    "__import__('subprocess').Popen(['true'])",
])
def test_execute_denied_when_aliased(alpha: httpx.Client, session_id: str, code: str) -> None:
    result = execute(alpha, session_id, code)
    assert result["status"] == "denied", result
    assert "line 2" in result["error"]["evalue"] or "line 1" in result["error"]["evalue"]


def test_execute_allowed_code_runs_and_syntax_error_reaches_kernel(alpha: httpx.Client,
                                                                  session_id: str) -> None:
    assert execute(alpha, session_id, "print(6 * 7)")["stdout"] == "42\n"
    broken = execute(alpha, session_id, "def f(:\n  pass")
    assert broken["status"] == "error" and broken["error"]["ename"] == "SyntaxError"


# -- approvals ------------------------------------------------------------------------------------


async def test_approval_approved_runs(governed: GatewayProcess, alpha: httpx.Client,
                                      session_id: str) -> None:
    url = f"{governed.url.replace('http', 'ws', 1)}/v1/sessions/{session_id}/ws"
    code = "open('approved.txt', 'w').write('ran'); 'needs-approval'\nprint('ran')"
    async with connect(url, additional_headers=governed.headers()) as ws:
        await ws.send(json.dumps({"type": "execute", "code": code, "id": "approve-1"}))
        held = json.loads(await asyncio.wait_for(ws.recv(), 20))
        assert held["type"] == "pending_approval" and held["rules"] == ["ask-first"]
        approval_id = held["approval_id"]
        listed = await asyncio.to_thread(alpha.get, "/v1/approvals")
        assert [(a["approval_id"], a["code"]) for a in listed.json()] == [(approval_id, code)]
        history = (await asyncio.to_thread(
            alpha.get, f"/v1/sessions/{session_id}/executions")).json()
        assert history[-1]["id"] == "approve-1" and history[-1]["status"] == "pending_approval"
        assert not await asyncio.to_thread(file_exists, alpha, session_id, "approved.txt")
        async with httpx.AsyncClient(base_url=governed.url, timeout=30) as client:
            path = f"/v1/approvals/{approval_id}/approve"
            as_agent = await client.post(path, headers=governed.headers("alpha"))
            assert as_agent.status_code == 403
            other_tenant = await client.post(path, headers=bearer(BOB))
            assert other_tenant.status_code == 404
            decided = await client.post(path, headers=bearer(ALICE),
                                        json={"comment": "looks fine"})
            assert decided.status_code == 200, decided.text
            assert decided.json()["status"] == "approved"
            again = await client.post(path, headers=bearer(ALICE))
            assert again.status_code == 409
        frames = []
        while not frames or frames[-1]["type"] != "done":
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
    assert frames[0]["type"] == "approval" and frames[0]["decision"] == "approved"
    assert frames[0]["by"] == "alice"
    assert frames[-1]["status"] == "ok"
    assert await asyncio.to_thread(file_exists, alpha, session_id, "approved.txt")
    extra = audit_extra(governed, "approve-1")
    assert extra["policy"]["decision"] == "approve"
    assert extra["approval"]["decision"] == "approved"
    assert extra["approval"]["by"] == "alice" and extra["approval"]["comment"] == "looks fine"
    assert extra["approval"]["at"]


def test_approval_rejected_never_runs(governed: GatewayProcess, alpha: httpx.Client,
                                      session_id: str) -> None:
    code = "open('rejected.txt', 'w').write('ran'); 'needs-approval'"
    with ThreadPoolExecutor(1) as pool:
        running: Future[dict[str, Any]] = pool.submit(execute, alpha, session_id, code)
        approval = wait_pending(alpha, session_id)
        answer = httpx.post(f"{governed.url}/v1/approvals/{approval['approval_id']}/reject",
                            headers=bearer(ALICE), json={"comment": "not today"})
        assert answer.status_code == 200, answer.text
        result = running.result(30)
    assert result["status"] == "denied"
    assert "rejected by alice (not today)" in result["error"]["evalue"]
    assert not file_exists(alpha, session_id, "rejected.txt")
    extra = audit_extra(governed, result["id"])
    assert extra["approval"]["decision"] == "rejected" and extra["approval"]["by"] == "alice"


def test_approval_expired_is_denied(governed: GatewayProcess, alpha: httpx.Client,
                                    session_id: str) -> None:
    started = time.monotonic()
    result = execute(alpha, session_id, "open('expired.txt', 'w'); 'needs-approval'")
    assert APPROVAL_TIMEOUT_S - 1 < time.monotonic() - started < APPROVAL_TIMEOUT_S + 10
    assert result["status"] == "denied"
    assert f"expired after {APPROVAL_TIMEOUT_S}s" in result["error"]["evalue"]
    assert not file_exists(alpha, session_id, "expired.txt")
    assert audit_extra(governed, result["id"])["approval"]["decision"] == "expired"
    assert alpha.get("/v1/approvals").json() == []


def test_interrupt_withdraws_held_execution(governed: GatewayProcess, alpha: httpx.Client,
                                            session_id: str) -> None:
    code = "open('withdrawn.txt', 'w'); 'needs-approval'"
    with ThreadPoolExecutor(1) as pool:
        running: Future[dict[str, Any]] = pool.submit(execute, alpha, session_id, code)
        approval = wait_pending(alpha, session_id)
        interrupted = alpha.post(f"/v1/sessions/{session_id}/interrupt")
        assert interrupted.json() == {"interrupted": True}
        result = running.result(30)
    assert result["status"] == "interrupted"
    assert not file_exists(alpha, session_id, "withdrawn.txt")
    assert alpha.get("/v1/approvals").json() == []
    late = httpx.post(f"{governed.url}/v1/approvals/{approval['approval_id']}/approve",
                      headers=bearer(ALICE))
    assert late.status_code == 409 and "withdrawn" in late.json()["detail"]
    assert audit_extra(governed, result["id"])["approval"]["decision"] == "withdrawn"
    assert execute(alpha, session_id, "print('still usable')")["stdout"] == "still usable\n"


def test_approvals_refuse_missing_key(governed: GatewayProcess) -> None:
    assert httpx.get(f"{governed.url}/v1/approvals").status_code == 401
    assert httpx.post(f"{governed.url}/v1/approvals/x/approve").status_code == 401
    assert httpx.get(f"{governed.url}/v1/approvals", headers=bearer(BOB)).json() == []


# -- budgets --------------------------------------------------------------------------------------


def test_budget_executions_exhausted(alpha: httpx.Client) -> None:
    sid = new_session(alpha, "counted")
    try:
        assert alpha.get(f"/v1/sessions/{sid}").json()["budget"] == {
            "executions_left": 2, "wall_time_left_s": None, "cpu_time_left_s": None,
            "lifetime_left_s": None}
        assert execute(alpha, sid, "x = 1")["status"] == "ok"
        assert execute(alpha, sid, "x += 1")["status"] == "ok"
        assert alpha.get(f"/v1/sessions/{sid}").json()["budget"]["executions_left"] == 0
        result = execute(alpha, sid, "open('over.txt', 'w')")
        assert result["status"] == "budget_exceeded"
        assert result["error"]["ename"] == "BudgetExceeded"
        assert "max_executions" in result["error"]["evalue"]
        assert "new session" in result["error"]["evalue"]
        assert not file_exists(alpha, sid, "over.txt")
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_budget_wall_time_clamps_timeout_then_exhausts(alpha: httpx.Client) -> None:
    sid = new_session(alpha, "timed")
    try:
        assert alpha.get(f"/v1/sessions/{sid}").json()["budget"]["wall_time_left_s"] == 2
        started = time.monotonic()
        result = execute(alpha, sid, "import time\ntime.sleep(20)", timeout_s=30)
        assert result["status"] == "timeout"  # clamped to the 2 s left, not 30
        assert time.monotonic() - started < 15
        session = alpha.get(f"/v1/sessions/{sid}").json()
        assert session["budget"]["wall_time_left_s"] == 0
        result = execute(alpha, sid, "1")
        assert result["status"] == "budget_exceeded"
        assert "max_wall_time_s" in result["error"]["evalue"]
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


# -- egress ---------------------------------------------------------------------------------------


def test_egress_profile_reaches_only_listed_host(alpha: httpx.Client, allowed_port: int) -> None:
    sid = new_session(alpha, "egress")
    try:
        code = """
import requests
for url in {urls!r}:
    try:
        r = requests.get(url, timeout=10)
        print(r.status_code, r.text.strip()[:80])
    except Exception as exc:
        print('failed', type(exc).__name__)
"""
        urls = [f"http://127.0.0.1:{allowed_port}/", f"http://127.0.0.1:{allowed_port + 1}/",
                "http://169.254.169.254/"]
        lines = execute(alpha, sid, code.format(urls=urls))["stdout"].splitlines()
        assert lines[0] == "200 hello from the allowed host"
        assert lines[1].startswith("403 replgate egress refused")
        assert lines[2].startswith("403 replgate egress refused")
        log = alpha.get(f"/v1/sessions/{sid}/egress").json()
        assert [(a["port"], a["allowed"]) for a in log] == [
            (allowed_port, True), (allowed_port + 1, False), (80, False)]
        assert {a["session_id"] for a in log} == {sid}
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


# -- start-up -------------------------------------------------------------------------------------


def test_start_fails_on_bad_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[defaults]\nrules = ["builtin.nope"]\n')
    process = make_gateway(policy_file=str(policy))
    with pytest.raises(RuntimeError, match=r"no rule 'builtin.nope'; known: builtin.credentials"):
        process.start(timeout_s=60)
    process.stop()


def test_example_policy_file_loads() -> None:
    policy = load_policy(Path(__file__).parents[2] / "docs" / "policy.example.toml")
    assert "no-rmtree" in [rule.id for rule in policy.rules_for("acme", "web")]
    assert policy.budgets_for("trial", "web").max_lifetime_s == 3600


@pytest.mark.parametrize(("code", "rule"), [
    ("!ls", "builtin.shell"),
    ("x = !ls", "builtin.shell"),
    ("%%bash\necho hi", "builtin.shell"),
    ("%pip install requests", "builtin.pip"),
    ("import ctypes.util", "builtin.ctypes"),
    ("import socket as s\ns.socket()", "builtin.socket"),
    ("open('/home/u/.ssh/id_rsa')", "builtin.credentials"),
    ("%time __import__('os').system('x')", "builtin.subprocess"),
    ("!true\nx = (1\n%1)\nimport os; os.system('x')", "builtin.subprocess"),
])
def test_decide_matches_builtin_rule(code: str, rule: str) -> None:
    _, matches = decide(list(BUILTIN_RULES.values()), code)
    assert rule in [m.rule for m in matches]
