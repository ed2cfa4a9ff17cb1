"""Code contexts over HTTP and the WebSocket: a gateway whose profile names the default image by
its old name, ``polyglot``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import nbformat
import pytest
from websockets.sync.client import connect

from kernel_pool.backends.docker import build_image
from tests.conftest import CLIENT_TIMEOUT_S, GatewayProcess, running_gateway


@pytest.fixture(scope="module")
def polyglot_gateway(docker_client: docker.DockerClient,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    build_image(docker_client, state_dir=tmp_path_factory.mktemp("images"), log=lambda _: None)
    with running_gateway(docker_client, image="polyglot") as process:
        yield process


@pytest.fixture(scope="module")
def client(polyglot_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=polyglot_gateway.url, headers=polyglot_gateway.headers(),
                      timeout=CLIENT_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def sid(client: httpx.Client) -> Iterator[str]:
    answer = client.post("/v1/sessions")
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    client.delete(f"/v1/sessions/{answer.json()['id']}")


def run(client: httpx.Client, sid: str, code: str, **fields: Any) -> dict[str, Any]:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code, **fields})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_execute_in_a_language_keeps_its_state(client: httpx.Client, sid: str) -> None:
    assert run(client, sid, "x <- 6 * 7", language="R")["status"] == "ok"
    got = run(client, sid, "cat(x)", language="r")
    assert (got["status"], got["stdout"], got["language"]) == ("ok", "42", "r")
    python = run(client, sid, "x = 1; print(x)")
    assert (python["stdout"], python["language"]) == ("1\n", "python")
    contexts = client.get(f"/v1/sessions/{sid}/contexts").json()
    assert [c["id"] for c in contexts][:2] == ["python", "r"]
    assert contexts[1]["language"] == "r" and contexts[1]["running"] is True


def test_unknown_language_and_context_are_refused(client: httpx.Client, sid: str) -> None:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": "1", "language": "cobol"})
    assert answer.status_code == 400
    assert "python, bash, r, javascript, java, typescript" in answer.json()["detail"]
    missing = client.post(f"/v1/sessions/{sid}/execute", json={"code": "1", "context_id": "nope"})
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]
    made = client.post(f"/v1/sessions/{sid}/contexts", json={"language": "klingon"})
    assert made.status_code == 400 and "klingon" in made.json()["detail"]


def test_a_context_is_made_restarted_and_removed(client: httpx.Client, sid: str) -> None:
    made = client.post(f"/v1/sessions/{sid}/contexts", json={"language": "bash"})
    assert made.status_code == 201, made.text
    context = made.json()
    assert (context["language"], context["running"]) == ("bash", False)
    cid = context["id"]
    assert run(client, sid, "n=5", context_id=cid)["status"] == "ok"
    assert run(client, sid, "echo ${n:-unset}", context_id=cid)["stdout"] == "5\n"
    restarted = client.post(f"/v1/sessions/{sid}/contexts/{cid}/restart")
    assert restarted.status_code == 200 and restarted.json()["execution_count"] == 0
    assert run(client, sid, "echo ${n:-unset}", context_id=cid)["stdout"] == "unset\n"
    assert client.delete(f"/v1/sessions/{sid}/contexts/{cid}").status_code == 204
    assert client.delete(f"/v1/sessions/{sid}/contexts/{cid}").status_code == 404
    assert client.delete(f"/v1/sessions/{sid}/contexts/python").status_code == 400


def test_a_kernel_that_fails_to_start_quotes_its_stderr(client: httpx.Client) -> None:
    """The session's variables reach its contexts' kernels as they start: one that breaks
    Python's start (no standard library under ``PYTHONHOME``) makes the Bash kernel (a Python
    program) die at once, and the answer quotes the end of what it wrote to stderr."""
    answer = client.post("/v1/sessions", json={"env": {"PYTHONHOME": "/nonexistent"}})
    assert answer.status_code == 201, answer.text
    broken = answer.json()["id"]
    try:
        result = run(client, broken, "echo hi", language="bash")
        assert result["status"] == "error", result
        reason = result["reason"]
        assert "the Bash kernel did not start" in reason, reason
        assert "its standard error ends:" in reason, reason
        assert "No module named 'encodings'" in reason, reason  # Python's own words
        quoted = reason.split("its standard error ends:\n", 1)[1]
        assert len(quoted.splitlines()) <= 20 and len(quoted.encode()) <= 4096, quoted
        assert run(client, broken, "print(6 * 7)")["stdout"] == "42\n"  # Python's is fine
    finally:
        client.delete(f"/v1/sessions/{broken}")


def test_websocket_streams_javascript(polyglot_gateway: GatewayProcess, sid: str) -> None:
    url = polyglot_gateway.url.replace("http", "ws", 1) + f"/v1/sessions/{sid}/ws"
    with connect(url, additional_headers=polyglot_gateway.headers()) as ws:
        ws.send(json.dumps({"type": "execute", "code": "console.log('hi'); 1 + 1",
                            "language": "ts", "id": "ws-js-1"}))
        frames = []
        while not frames or frames[-1]["type"] != "done":
            frames.append(json.loads(ws.recv(timeout=60)))
    kinds = [(f["type"], f.get("text") or f.get("data", {}).get("text/plain")) for f in frames]
    assert ("stdout", "hi\n") in kinds and ("result", "2") in kinds, frames
    assert frames[-1]["status"] == "ok" and frames[-1]["language"] == "typescript"


def test_notebook_tags_cells_with_their_language(client: httpx.Client, sid: str) -> None:
    run(client, sid, "print(1)")
    run(client, sid, "cat(2)", language="r")
    answer = client.get(f"/v1/sessions/{sid}/notebook")
    assert answer.status_code == 200
    notebook = nbformat.from_dict(answer.json())
    nbformat.validate(notebook)
    languages = [cell.metadata.get("replgate", {}).get("language", "python")
                 for cell in notebook.cells]
    assert languages[-2:] == ["python", "r"]
    assert notebook.cells[-1].metadata["vscode"] == {"languageId": "r"}


@pytest.mark.parametrize(("kernel", "code"), [("ir", "x <- 6 * 7\ncat(x)"),
                                           ("java", "int x = 6 * 7;\nSystem.out.print(x);")])
def test_jupyter_api_offers_each_language_and_runs_r_and_java(
        polyglot_gateway: GatewayProcess, client: httpx.Client, kernel: str, code: str) -> None:
    specs = client.get("/api/kernelspecs").json()["kernelspecs"]
    assert set(specs) == {"python3", "ir", "deno", "bash", "java"}
    assert [specs[name]["spec"]["language"] for name in ("ir", "deno", "java")] == [
        "R", "typescript", "java"]
    started = client.post("/api/kernels", json={"name": kernel})
    assert started.status_code == 201 and started.json()["name"] == kernel, started.text
    kid = started.json()["id"]
    url = polyglot_gateway.url.replace("http", "ws", 1) + f"/api/kernels/{kid}/channels"
    request = {"header": {"msg_id": "c-1", "msg_type": "execute_request", "session": "s",
                          "username": "test", "version": "5.3", "date": ""},
               "parent_header": {}, "metadata": {}, "channel": "shell",
               "content": {"code": code, "silent": False}}
    try:
        with connect(url, additional_headers=polyglot_gateway.headers()) as ws:
            ws.send(json.dumps(request))
            replies: list[dict[str, Any]] = []
            while not replies or replies[-1]["msg_type"] != "execute_reply":
                message = json.loads(ws.recv(timeout=60))
                if message["parent_header"].get("msg_id") == "c-1":
                    replies.append(message)
    finally:
        assert client.delete(f"/api/kernels/{kid}").status_code == 204
    printed = [m["content"]["text"] for m in replies if m["msg_type"] == "stream"]
    assert printed == ["42"] and replies[-1]["content"]["status"] == "ok", replies


def test_a_memory_pause_keeps_every_context_across_a_gateway_restart(
        polyglot_gateway: GatewayProcess, docker_client: docker.DockerClient) -> None:
    """Their kernels are in the memory image; a gateway killed and started again lists them
    while paused and connects them as the session resumes, variables and all."""
    with running_gateway(docker_client, image="polyglot", keep_sessions_on_stop="true",
                         pause_with="memory") as process:
        with httpx.Client(base_url=process.url, headers=process.headers(),
                          timeout=CLIENT_TIMEOUT_S) as c:
            sid = c.post("/v1/sessions").json()["id"]
            assert run(c, sid, "x <- 41", language="r")["status"] == "ok"
            cid = c.post(f"/v1/sessions/{sid}/contexts", json={"language": "bash"}).json()["id"]
            assert run(c, sid, "n=41", context_id=cid)["status"] == "ok"
            assert run(c, sid, "var y = 41", language="js")["status"] == "ok"
            paused = c.post(f"/v1/sessions/{sid}/pause")
            assert paused.status_code == 200, paused.text
            assert (paused.json()["paused_with"], paused.json()["not_kept"]) == ("memory", {})
        process.stop(signal.SIGKILL)
        process.start()
        with httpx.Client(base_url=process.url, headers=process.headers(),
                          timeout=CLIENT_TIMEOUT_S) as c:
            listed = {x["id"]: x["running"] for x in c.get(f"/v1/sessions/{sid}/contexts").json()}
            assert listed == {"python": True, "r": False, cid: False, "javascript": False}
            r = run(c, sid, "cat(x + 1)", language="r")
            assert (r["stdout"], r["restarted"]) == ("42", False), json.dumps(r)
            bash = run(c, sid, "echo $((n + 1))", context_id=cid)
            assert (bash["stdout"], bash["restarted"]) == ("42\n", False), bash
            js = run(c, sid, "console.log(y + 1)", language="javascript")
            assert (js["stdout"], js["restarted"]) == ("42\n", False), js
            assert c.get(f"/v1/sessions/{sid}").json()["reason"] is None
            assert c.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_slim_gateway_offers_python_and_bash_only(
        docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> None:
    """REPLGATE_IMAGE=slim: the opt-in image of Python and bash; another language is a 400
    naming those two."""
    build_image(docker_client, state_dir=tmp_path_factory.mktemp("images"), slim=True,
                log=lambda _: None)
    with running_gateway(docker_client, image="slim") as gateway, httpx.Client(
            base_url=gateway.url, headers=gateway.headers(), timeout=CLIENT_TIMEOUT_S) as c:
        specs = c.get("/api/kernelspecs").json()["kernelspecs"]
        assert set(specs) == {"python3", "bash"}
        sid = c.post("/v1/sessions").json()["id"]
        try:
            for language in ("r", "java", "js"):
                answer = c.post(f"/v1/sessions/{sid}/execute",
                                json={"code": "1", "language": language})
                assert answer.status_code == 400, answer.text
                assert "offers: python, bash (" in answer.json()["detail"], answer.text
            bash = c.post(f"/v1/sessions/{sid}/execute",
                          json={"code": "echo hi", "language": "bash"}).json()
            assert (bash["status"], bash["stdout"]) == ("ok", "hi\n"), bash
        finally:
            c.delete(f"/v1/sessions/{sid}")
