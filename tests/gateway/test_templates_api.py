"""Custom templates through the native API (``/v1/templates``, docs/templates.md), on the real
engine: a template FROM the sandbox image that adds a PyPI package and a file of its context,
built, followed (log and WebSocket), and used by sessions (a warm kernel of it after the
first) and by Jupyter's kernelspecs, its images removed with it; a failing step named by its
line, a step past its timeout too; builds at once counted per tenant; a base without Python
refused at build, never at a session's start; a start_cmd's server ready at once in every
session (booted, warm, restored from the kernel template); bad input a clear 4xx; another
tenant's template absent until an operator publishes it; a restarted gateway keeps its
templates."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent
from websockets.sync.client import connect

from kernel_pool.backends.docker import current_image
from tests.conftest import GatewayProcess, running_gateway

ADMIN_KEY = "rg_admin_templates_test"
PACKAGE = "tomli_w"
"""A small pure-Python package on PyPI that the sandbox image does not have."""


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    """A gateway of its own, with an operator's key (publishing is theirs)."""
    with running_gateway(docker_client, admin_keys=ADMIN_KEY,
                         max_template_builds_per_tenant="1") as process:
        yield process


@pytest.fixture(scope="module")
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120, headers=gateway.headers("alpha")) as c:
        yield c


@pytest.fixture(scope="module")
def beta(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120, headers=gateway.headers("beta")) as c:
        yield c


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _build(client: httpx.Client, name: str, dockerfile: str,
           context: bytes | None = None, **fields: str) -> dict[str, Any]:
    files: dict[str, Any] = {"dockerfile": ("Dockerfile", dockerfile.encode())}
    if context is not None:
        files["context"] = ("context.tar.gz", context, "application/gzip")
    answer = client.post("/v1/templates", data={"name": name, **fields}, files=files)
    assert answer.status_code == 202, answer.text
    info: dict[str, Any] = answer.json()
    assert info["status"] == "building" and info["name"] == name
    return info


def _ended(client: httpx.Client, template_id: str, within_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        info: dict[str, Any] = client.get(f"/v1/templates/{template_id}").json()
        if info["status"] != "building":
            return info
        time.sleep(1)
    raise AssertionError(f"template {template_id} still building after {within_s} s")


def _run(client: httpx.Client, session_id: str, code: str) -> dict[str, Any]:
    answer = client.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.fixture(scope="module")
def template(alpha: httpx.Client,
             docker_client: docker.DockerClient) -> Iterator[dict[str, Any]]:
    dockerfile = (f"FROM {current_image()}\n"
                  "USER root\n"
                  f"RUN pip install --no-cache-dir --disable-pip-version-check {PACKAGE}==1.0.0\n"
                  "COPY data/hello.txt /opt/data/hello.txt\n")
    info = _build(alpha, "with-tomli", dockerfile, _tar({"data/hello.txt": b"from the context"}))
    ended = _ended(alpha, info["id"])
    assert ended["status"] == "ready", ended["error"]
    yield ended
    assert alpha.delete(f"/v1/templates/{info['id']}").status_code == 204
    _gone(docker_client, str(ended["image"]))  # once its last container has gone


def test_a_template_adds_a_package_and_a_file_that_its_sessions_find(
        alpha: httpx.Client, template: dict[str, Any]) -> None:
    assert template["id"].startswith("tpl_") and template["image_size"] > 0
    assert template["profile"] == f"{template['id']}-1" and template["builds"] == 1
    assert "python" in template["languages"] and template["lacks"] == []
    code = (f"import {PACKAGE}, pathlib; print({PACKAGE}.dumps({{'a': 1}}).strip(), "
            "pathlib.Path('/opt/data/hello.txt').read_text())")
    started = []
    for _ in range(2):  # the second from the warm kernel the first one's create asked for
        begun = time.monotonic()
        answer = alpha.post("/v1/sessions", json={"profile": "with-tomli"})
        started.append(time.monotonic() - begun)
        assert answer.status_code == 201, answer.text
        session = answer.json()
        try:
            assert session["profile"] == template["profile"]
            result = _run(alpha, session["id"], code)
            assert result["error"] is None, result["error"]
            assert result["stdout"].strip() == "a = 1 from the context"
            # No network in the sandbox: PyPI was reachable during the build only.
            offline = _run(alpha, session["id"], "import urllib.request as u\n"
                           "u.urlopen('https://pypi.org', timeout=5)")
            assert offline["error"] is not None
        finally:
            alpha.delete(f"/v1/sessions/{session['id']}")
        time.sleep(3)  # time for the warm kernel to come up
    by_id = alpha.post("/v1/sessions", json={"profile": template["id"]})
    assert by_id.status_code == 201, by_id.text
    alpha.delete(f"/v1/sessions/{by_id.json()['id']}")
    # Jupyter: the template's kernelspecs (its current build's), and a kernel of one.
    specs = alpha.get("/api/kernelspecs").json()["kernelspecs"]
    assert template["profile"] in specs and "bash" in specs
    kernel = alpha.post("/api/kernels", json={"name": template["profile"]})
    assert kernel.status_code == 201, kernel.text
    alpha.delete(f"/api/kernels/{kernel.json()['id']}")


def test_a_template_session_pauses_resumes_and_forks_on_its_image(
        alpha: httpx.Client, template: dict[str, Any]) -> None:
    made = alpha.post("/v1/sessions", json={"profile": "with-tomli"})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    children: list[dict[str, Any]] = []
    try:
        _run(alpha, sid, f"import {PACKAGE}; x = {PACKAGE}.dumps({{'k': 2}})")
        paused = alpha.post(f"/v1/sessions/{sid}/pause")
        assert paused.status_code == 200, paused.text
        assert _run(alpha, sid, "print(x.strip())")["stdout"] == "k = 2\n"  # resumed
        forked = alpha.post(f"/v1/sessions/{sid}/fork", json={"count": 1})
        assert forked.status_code in (200, 201), forked.text
        children = forked.json()
        assert children[0]["profile"] == template["profile"]
        result = _run(alpha, children[0]["id"],
                      f"import {PACKAGE}; print(x.strip(), open('/opt/data/hello.txt').read())")
        assert result["stdout"] == "k = 2 from the context\n", result
    finally:
        for child in children:
            alpha.delete(f"/v1/sessions/{child['id']}")
        alpha.delete(f"/v1/sessions/{sid}")


async def test_an_mcp_connection_runs_on_the_template_it_names(
        gateway: GatewayProcess, template: dict[str, Any]) -> None:
    http = httpx2.AsyncClient(headers=gateway.headers("alpha"),
                              timeout=httpx2.Timeout(30, read=300))
    url = f"{gateway.url}/mcp?profile=with-tomli"
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool("execute_python", {
            "code": f"import {PACKAGE}; print(open('/opt/data/hello.txt').read())"})
    text = "".join(part.text for part in result.content if isinstance(part, TextContent))
    assert "from the context" in text and not result.is_error, text


def test_a_builds_log_is_read_and_streamed(gateway: GatewayProcess, alpha: httpx.Client,
                                           template: dict[str, Any]) -> None:
    lines = alpha.get(f"/v1/templates/{template['id']}/logs").json()
    assert [line["offset"] for line in lines] == list(range(len(lines)))
    text = "\n".join(line["text"] for line in lines)
    assert "Step 4/5 : RUN pip install" in text and "kernel runs Python 3.11" in text
    tail = alpha.get(f"/v1/templates/{template['id']}/logs", params={"offset": 2}).json()
    assert tail == lines[2:]
    ws_url = gateway.url.replace("http", "ws") + f"/v1/templates/{template['id']}/logs/ws"
    with connect(ws_url, additional_headers=gateway.headers("alpha")) as ws:
        frames = [json.loads(frame) for frame in ws]
    assert [f["text"] for f in frames[:-1]] == [line["text"] for line in lines]
    assert frames[-1] == {"type": "end", "status": "ready", "error": None}


def test_a_failing_step_names_its_line_and_why(alpha: httpx.Client) -> None:
    dockerfile = (f"FROM {current_image()}\n"
                  "# a comment, not a step\n"
                  "RUN echo preparing && \\\n"
                  "    ls /no/such/folder\n"
                  "RUN echo never\n")
    info = _build(alpha, "broken", dockerfile)
    try:
        ended = _ended(alpha, info["id"])
        assert ended["status"] == "failed" and ended["failed_line"] == 3
        assert ended["error"].startswith("line 3 (RUN echo preparing && ) failed: The command")
        assert "No such file or directory" in ended["error"]  # its last output
        log = alpha.get(f"/v1/templates/{info['id']}/logs").json()
        assert log[-1]["error"] is True and "line 3" in log[-1]["text"]
        refused = alpha.post("/v1/sessions", json={"profile": "broken"})
        assert refused.status_code == 409, refused.text
    finally:
        assert alpha.delete(f"/v1/templates/{info['id']}").status_code == 204


def test_a_base_without_python_fails_its_build_with_the_reason(alpha: httpx.Client) -> None:
    dockerfile = (f"FROM {current_image()}\n"
                  "USER root\n"
                  "RUN rm -rf /opt/venv /usr/local/bin/python3* /usr/bin/python3*\n")
    info = _build(alpha, "no-python", dockerfile)
    try:
        ended = _ended(alpha, info["id"])
        assert ended["status"] == "failed" and ended["failed_line"] is None
        assert "replgate's sandbox layer failed" in ended["error"]
        assert "the image has no python3" in ended["error"]
    finally:
        alpha.delete(f"/v1/templates/{info['id']}")


def test_a_step_past_its_timeout_fails_and_builds_are_counted_per_tenant(
        alpha: httpx.Client, beta: httpx.Client) -> None:
    dockerfile = f"FROM {current_image()}\nRUN echo waiting && sleep 60\n"
    info = _build(alpha, "slow", dockerfile, step_timeout_s="2")
    try:
        second = alpha.post("/v1/templates", json={"name": "other", "dockerfile": dockerfile})
        assert second.status_code == 429, second.text
        assert "REPLGATE_MAX_TEMPLATE_BUILDS_PER_TENANT" in second.json()["detail"]
        again = alpha.post("/v1/templates", json={"name": "slow", "dockerfile": dockerfile})
        assert again.status_code == 429, again.text  # the quota first, then the conflict
        other = _build(beta, "elsewhere", f"FROM {current_image()}\n")  # beta's own quota
        ended = _ended(alpha, info["id"], within_s=120)
        assert ended["status"] == "failed" and ended["failed_line"] == 2
        assert ended["error"].startswith("line 2 (RUN echo waiting && sleep 60) failed: ran "
                                         "past its timeout of 2 s")
        assert ended["error"].endswith("its last output:\nwaiting")
        assert _ended(beta, other["id"])["status"] == "ready"
        beta.delete(f"/v1/templates/{other['id']}")
    finally:
        alpha.delete(f"/v1/templates/{info['id']}")


def _gone(docker_client: docker.DockerClient, image: str, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            docker_client.images.get(image)
        except docker.errors.ImageNotFound:
            return
        time.sleep(1)
    raise AssertionError(f"{image} still there after {within_s} s")


SERVE = "sleep 2; exec python3 -m http.server 8080"
"""Slow to listen: a session handed out before it is ready would find no server."""
SERVED = ("import os, pathlib, urllib.request as u\n"
          "status = u.urlopen('http://127.0.0.1:8080', timeout=5).status\n"
          "servers = sum(p.read_bytes().startswith(b'python3\\0-m\\0http.server')\n"
          "              for p in pathlib.Path('/proc').glob('[0-9]*/cmdline'))\n"
          "print(os.getpid(), status, servers)")
"""Asked once, at once, in a new session: the kernel's pid (a restored kernel's is the kernel
template's, 10000), what the template's server answers, and how many servers run."""


def test_a_template_with_a_start_cmd_starts_sessions_with_its_server_ready(
        alpha: httpx.Client, docker_client: docker.DockerClient) -> None:
    served = _build(alpha, "served", f"FROM {current_image()}\n", start_cmd=SERVE,
                    ready_cmd="curl -sf localhost:8080 || python3 -c \"import urllib.request "
                              "as u; u.urlopen('http://localhost:8080')\"")
    dead = None
    try:
        ended = _ended(alpha, served["id"], within_s=300)
        assert ended["status"] == "ready", ended["error"]
        text = [line["text"] for line in alpha.get(f"/v1/templates/{served['id']}/logs").json()]
        assert "replgate: ready_cmd exited 0" in text
        # The first from a kernel booted with its server, the next from the warm kernel the
        # first create asked for, then one restored from the kernel template (made during the
        # build's check, with the server listening): each answers at once, one server each.
        restored = False
        deadline = time.monotonic() + 120
        while not restored:
            assert time.monotonic() < deadline, "no session restored from the kernel template"
            made = alpha.post("/v1/sessions", json={"profile": "served"})
            assert made.status_code == 201, made.text
            session = made.json()["id"]
            try:
                result = _run(alpha, session, SERVED)
                assert result["error"] is None, result["error"]
                pid, status, servers = result["stdout"].split()
                assert (status, servers) == ("200", "1")
                restored = pid == "10000"
            finally:
                alpha.delete(f"/v1/sessions/{session}")
            time.sleep(1)  # time for the warm kernel to come up
        dead = _build(alpha, "dead-start", f"FROM {current_image()}\n",
                      start_cmd="echo giving up >&2; exit 3", ready_cmd="false")
        failed = _ended(alpha, dead["id"], within_s=300)
        assert failed["status"] == "failed"
        assert failed["error"].startswith("the template's service does not start in the "
                                          "image: "), failed["error"]
        assert "start_cmd exited with 3 before ready_cmd exited 0" in failed["error"]
        assert "giving up" in failed["error"]
        # Its check failed: the image is of no use, and goes as soon as nothing holds it
        # (a kernel template being made of it ends with its launcher, not at its timeout).
        _gone(docker_client, f"replgate-template:{dead['id']}-1", within_s=30)
    finally:
        for made_ in (served, dead):
            if made_ is not None:
                alpha.delete(f"/v1/templates/{made_['id']}")


def test_bad_input_is_a_clear_4xx(alpha: httpx.Client) -> None:
    bad = [({"name": "Upper Case", "dockerfile": "FROM x"}, "name"),
           ({"name": "ok", "dockerfile": ""}, "dockerfile"),
           ({"name": "ok", "dockerfile": "FROM x", "context": "not base64!"}, "unreadable"),
           ({"name": "ok", "dockerfile": "FROM x", "context": "bm90IGEgdGFy"}, "not a usable tar"),
           ({"name": "ok", "dockerfile": "FROM x", "extra": 1}, "extra")]
    for body, said in bad:
        answer = alpha.post("/v1/templates", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert said in answer.json()["detail"], (body, answer.text)
    form = alpha.post("/v1/templates", data={"name": "ok"})
    assert form.status_code == 400 and "'dockerfile'" in form.json()["detail"]
    assert alpha.get("/v1/templates/tpl_nope").status_code == 404
    assert alpha.get("/v1/templates/tpl_nope/logs").status_code == 404


def test_another_tenant_cannot_use_it_until_an_operator_publishes_it(
        gateway: GatewayProcess, alpha: httpx.Client, beta: httpx.Client,
        template: dict[str, Any]) -> None:
    assert beta.get(f"/v1/templates/{template['id']}").status_code == 404
    assert template["id"] not in [t["id"] for t in beta.get("/v1/templates").json()]
    for name in (template["id"], template["profile"]):
        refused = beta.post("/v1/sessions", json={"profile": name})
        assert refused.status_code == 404, refused.text
    assert beta.post("/v1/sessions", json={"profile": "with-tomli"}).status_code == 400
    assert template["profile"] not in beta.get("/api/kernelspecs").json()["kernelspecs"]
    assert beta.post("/api/kernels", json={"name": template["profile"]}).status_code == 404
    path = f"/v1/templates/{template['id']}/publish"
    assert alpha.post(path, json={"public": True}).status_code == 403  # a tenant's key
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    published = httpx.post(gateway.url + path, json={"public": True}, headers=admin)
    assert published.status_code == 200 and published.json()["public"] is True
    try:
        made = beta.post("/v1/sessions", json={"profile": template["id"]})
        assert made.status_code == 201, made.text
        beta.delete(f"/v1/sessions/{made.json()['id']}")
        assert beta.delete(f"/v1/templates/{template['id']}").status_code == 403
    finally:
        httpx.post(gateway.url + path, json={"public": False}, headers=admin)
    assert beta.post("/v1/sessions", json={"profile": template["id"]}).status_code == 404


def test_a_restarted_gateway_keeps_its_templates_and_ends_a_build_under_way(
        gateway: GatewayProcess, alpha: httpx.Client, template: dict[str, Any]) -> None:
    under_way = _build(alpha, "interrupted", f"FROM {current_image()}\nRUN sleep 120\n")
    time.sleep(2)
    gateway.stop()
    gateway.start()
    try:
        ended = alpha.get(f"/v1/templates/{under_way['id']}").json()
        assert ended["status"] == "failed", ended
        assert "gateway stopped during the build" in ended["error"]
        assert alpha.get(f"/v1/templates/{template['id']}").json()["status"] == "ready"
        made = alpha.post("/v1/sessions", json={"profile": "with-tomli"})
        assert made.status_code == 201, made.text
        result = _run(alpha, made.json()["id"], f"import {PACKAGE}; print('ok')")
        assert result["stdout"] == "ok\n"
        alpha.delete(f"/v1/sessions/{made.json()['id']}")
    finally:
        alpha.delete(f"/v1/templates/{under_way['id']}")
