"""API fuzzing: schemathesis against the gateway's own OpenAPI schema, with a real key.

Every operation gets examples, boundary ("coverage") cases and random valid and invalid
inputs, a bounded number of each. The checks are the contract's: no 500 (a 503 at capacity
or a 507 when the disk is full is an answer), and an answer within the request timeout (no
hang). Half the generated path parameters name a live session (``fuzz_hooks.py``), so fuzzed
bodies reach a real sandbox; executions are capped at 5 s, so fuzzed code cannot hold the run.
Two workers send at once, so requests also meet each other (a metrics read meeting the
session's deletion was a 500 until they did).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.conftest import REPO, GatewayProcess, containers_of, make_gateway


@pytest.fixture(scope="module")
def fuzzed(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    gateway = make_gateway(max_timeout_s="5", default_timeout_s="5", max_kernels="4",
                           min_idle="1", max_sessions_per_tenant="3",
                           max_upload_bytes=str(2**20))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()
        left = containers_of(docker_client, gateway.owner)
        for cid in left:
            docker_client.api.remove_container(cid, force=True)
        assert not left


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fuzzed_requests_never_get_a_server_error_or_hang(fuzzed: GatewayProcess) -> None:
    schema = httpx.get(f"{fuzzed.url}/openapi.json").json()
    assert len(schema["paths"]) >= 10
    # A real session, so path parameters can also name something that exists.
    with httpx.Client(base_url=fuzzed.url, headers=fuzzed.headers(), timeout=60) as client:
        answer = client.post("/v1/sessions", json={})
        assert answer.status_code == 201
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.security.fuzz_hooks",
           "PYTHONPATH": str(REPO), "REPLGATE_FUZZ_SESSION": answer.json()["id"]}
    reports = Path(tempfile.mkdtemp(prefix="rg-fuzz-"))
    # One worker: with two, their threads' ast.parse calls (hypothesis describing a strategy's
    # lambda) met CPython 3.11's thread-unsafe AST recursion counter now and then
    # ("SystemError: AST constructor recursion depth mismatch", CPython gh-106905), failing a
    # run whose every request had passed.
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{fuzzed.url}/openapi.json",
        "--header", f"Authorization: Bearer {fuzzed.keys['alpha']}",
        "--checks", "no_internal_error", "--max-examples", "30",
        "--phases", "examples,coverage,fuzzing", "--request-timeout", "30",
        "--max-response-time", "30", "--workers", "1", "--seed", "20261122",
        "--generation-database", "none", "--no-color", "--report", "junit",
        "--report-dir", str(reports), "--warnings", "off",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=840,
                         cwd=reports, env=env)
    summary = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, summary
    assert "No issues found" in run.stdout or " passed" in run.stdout, summary
    log = fuzzed.log_path.read_text(errors="replace")
    assert "failed unexpectedly" not in log, log[log.find("failed unexpectedly") - 3000:][:6000]
    assert httpx.get(f"{fuzzed.url}/healthz", timeout=5).status_code == 200
