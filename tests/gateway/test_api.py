"""The HTTP API of a running ``replgate serve``, end to end, with real containers."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import nbformat
import pytest

from tests.conftest import GatewayProcess, containers_of


@pytest.fixture(scope="module")
def beta(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers("beta"), timeout=60) as c:
        yield c


def run(client: httpx.Client, sid: str, code: str, **extra: object) -> dict[str, object]:
    answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": code, **extra})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def test_healthz_answers_without_key(gateway: GatewayProcess) -> None:
    answer = httpx.get(f"{gateway.url}/healthz")
    assert answer.status_code == 200
    assert answer.json()["status"] == "ok"


def test_idle_connection_outlives_clients_reuse_window(gateway: GatewayProcess) -> None:
    # httpx reuses an idle connection for up to 5 s, the E2B SDK for 300 s: had the gateway
    # closed it at 5 s (uvicorn's default), a request sent that moment would meet a closing
    # connection (seen once through the E2B SDK: "connection closed before message completed").
    connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=30)
    try:
        statuses, sockets = [], []
        for pause in (0.0, 5.5):
            time.sleep(pause)
            connection.request("GET", "/healthz")  # on the same socket: http.client keeps it
            answer = connection.getresponse()  # RemoteDisconnected had the gateway closed it
            answer.read()
            statuses.append(answer.status)
            sockets.append(connection.sock)
    finally:
        connection.close()
    assert statuses == [200, 200]
    assert sockets[0] is sockets[1] is not None


def test_metrics_answer_without_key_and_hold_no_tenant(gateway: GatewayProcess,
                                                       alpha: httpx.Client,
                                                       session_id: str) -> None:
    run(alpha, session_id, "print('metrics')")
    text = httpx.get(f"{gateway.url}/metrics").text
    assert 'replgate_pool_kernels{state="in_use"}' in text
    assert 'replgate_executions_total{status="ok"}' in text
    assert "alpha" not in text and "print(" not in text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic abc"}])
def test_sessions_refuse_missing_or_wrong_key(gateway: GatewayProcess,
                                              headers: dict[str, str]) -> None:
    answer = httpx.get(f"{gateway.url}/v1/sessions", headers=headers)
    assert answer.status_code == 401
    assert "detail" in answer.json()


def test_session_create_get_list_matches_contract(alpha: httpx.Client, session_id: str) -> None:
    session = alpha.get(f"/v1/sessions/{session_id}").json()
    assert set(session) >= {"id", "tenant", "profile", "status", "execution_count",
                            "created_at", "last_active_at"}
    assert session["tenant"] == "alpha" and session["profile"] == "default"
    assert session["status"] in ("idle", "busy", "starting")
    assert session_id in [s["id"] for s in alpha.get("/v1/sessions").json()]


def test_other_tenant_sees_session_as_missing(beta: httpx.Client, session_id: str) -> None:
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/execute"),
                         ("POST", "/interrupt"), ("POST", "/restart"), ("GET", "/files"),
                         ("GET", "/files/a.txt"), ("GET", "/notebook")]:
        body = {"code": "1"} if path == "/execute" else None
        answer = beta.request(method, f"/v1/sessions/{session_id}{path}", json=body)
        assert answer.status_code == 404, (method, path, answer.text)
    assert session_id not in [s["id"] for s in beta.get("/v1/sessions").json()]


def test_execute_keeps_state_and_returns_outputs(alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})")
    result = run(alpha, session_id, "print(df.a.sum())\ndf")
    assert result["status"] == "ok"
    assert result["stdout"] == "6\n"
    outputs = result["outputs"]
    assert isinstance(outputs, list) and outputs[-1]["type"] == "result"
    assert "text/html" in outputs[-1]["data"]
    assert isinstance(result["execution_count"], int)


def test_execute_returns_png_for_a_chart(alpha: httpx.Client, session_id: str) -> None:
    result = run(alpha, session_id,
                 "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    images = [o["data"]["image/png"] for o in result["outputs"] if "image/png" in o["data"]]
    assert images and base64.b64decode(images[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_execute_reports_error_as_data(alpha: httpx.Client, session_id: str) -> None:
    result = run(alpha, session_id, "{}['missing']")
    assert result["status"] == "error"
    assert result["error"]["ename"] == "KeyError"
    assert result["error"]["traceback"]


def test_input_fails_fast(alpha: httpx.Client, session_id: str) -> None:
    result = run(alpha, session_id, "input('name? ')", timeout_s=20)
    assert result["status"] == "error"
    assert result["duration_ms"] < 5000
    assert "input" in result["error"]["evalue"]


def test_timeout_interrupts_and_keeps_session(alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "kept = 'yes'")
    result = run(alpha, session_id, "while True: pass", timeout_s=1.5)
    assert result["status"] == "timeout" and result["restarted"] is False
    assert run(alpha, session_id, "print(kept)")["stdout"] == "yes\n"


def test_files_round_trip_binary_and_nested(alpha: httpx.Client, session_id: str) -> None:
    payload = bytes(range(256)) * 10
    answer = alpha.put(f"/v1/sessions/{session_id}/files/data/in.bin", content=payload)
    assert answer.status_code == 201 and answer.json() == {"path": "data/in.bin",
                                                            "size": len(payload)}
    assert alpha.get(f"/v1/sessions/{session_id}/files/data/in.bin").content == payload
    listing = {f["path"]: f for f in alpha.get(f"/v1/sessions/{session_id}/files").json()}
    assert listing["data/in.bin"]["size"] == len(payload) and listing["data/in.bin"]["modified"]
    seen = run(alpha, session_id, "print(len(open('data/in.bin','rb').read()))")
    assert seen["stdout"] == f"{len(payload)}\n"


def test_files_written_by_code_are_downloadable(alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "df.to_csv('out/table.csv', index=False) if __import__('os').makedirs"
                           "('out', exist_ok=True) is None else None")
    assert alpha.get(f"/v1/sessions/{session_id}/files/out/table.csv").text == "a\n1\n2\n3\n"


@pytest.mark.parametrize("path", ["../etc/passwd", "..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd",
                                  "a/../../x", "escape/passwd"])
def test_files_refuse_paths_leaving_workspace(alpha: httpx.Client, session_id: str,
                                              path: str) -> None:
    run(alpha, session_id, "import os\nos.path.islink('escape') or os.symlink('/etc', 'escape')")
    answer = alpha.get(f"/v1/sessions/{session_id}/files/{path}")
    assert answer.status_code in (400, 404), answer.text
    assert "root:" not in answer.text
    put = alpha.put(f"/v1/sessions/{session_id}/files/{path}", content=b"x")
    assert put.status_code in (400, 404), put.text


def test_missing_file_is_404(alpha: httpx.Client, session_id: str) -> None:
    answer = alpha.get(f"/v1/sessions/{session_id}/files/nope.txt")
    assert answer.status_code == 404 and "detail" in answer.json()


def test_interrupt_when_idle_says_false(alpha: httpx.Client, session_id: str) -> None:
    answer = alpha.post(f"/v1/sessions/{session_id}/interrupt")
    assert answer.status_code == 200 and answer.json() == {"interrupted": False}


def test_history_lists_every_execution_in_order(alpha: httpx.Client, session_id: str) -> None:
    run(alpha, session_id, "print('history marker')")
    history = alpha.get(f"/v1/sessions/{session_id}/executions").json()
    assert [h["seq"] for h in history] == sorted(h["seq"] for h in history)
    assert history[-1]["code"] == "print('history marker')"
    assert history[-1]["result"]["stdout"] == "history marker\n"


def test_notebook_export_validates_and_reruns(alpha: httpx.Client, session_id: str,
                                              tmp_path: object) -> None:
    run(alpha, session_id, "print('in the notebook')")
    answer = alpha.get(f"/v1/sessions/{session_id}/notebook")
    assert answer.status_code == 200
    notebook = nbformat.reads(answer.text, as_version=4)
    nbformat.validate(notebook)
    codes = [c.source for c in notebook.cells]
    assert "print('in the notebook')" in codes
    cell = notebook.cells[codes.index("print('in the notebook')")]
    assert cell.outputs[0]["text"] == "in the notebook\n"
    kinds = {o["output_type"] for c in notebook.cells for o in c.outputs}
    assert {"stream", "display_data", "execute_result", "error"} <= kinds


def test_restart_drops_variables_keeps_files(alpha: httpx.Client) -> None:
    sid = alpha.post("/v1/sessions", json={}).json()["id"]
    try:
        run(alpha, sid, "x = 1\nopen('keep.txt', 'w').write('kept')")
        answer = alpha.post(f"/v1/sessions/{sid}/restart")
        assert answer.status_code == 200 and answer.json()["execution_count"] == 0
        result = run(alpha, sid, "print(open('keep.txt').read())\nx")
        assert result["stdout"] == "kept\n"
        assert result["error"]["ename"] == "NameError"
        assert result["execution_count"] == 1
    finally:
        alpha.delete(f"/v1/sessions/{sid}")


def test_delete_removes_container_and_workspace(gateway: GatewayProcess, alpha: httpx.Client,
                                                docker_client: object) -> None:
    import docker

    assert isinstance(docker_client, docker.DockerClient)
    sid = alpha.post("/v1/sessions", json={"env": {"MY_SETTING": "on"}}).json()["id"]
    assert run(alpha, sid, "import os; print(os.environ['MY_SETTING'])")["stdout"] == "on\n"
    before = set(containers_of(docker_client, gateway.owner))
    workspaces = set((gateway.state_dir / "workspaces").iterdir())
    assert alpha.delete(f"/v1/sessions/{sid}").status_code == 204
    after = set(containers_of(docker_client, gateway.owner))
    assert len(before - after) >= 1
    # (the warm pool's refill may have made a workspace meanwhile: the session's must be gone)
    assert workspaces - set((gateway.state_dir / "workspaces").iterdir())
    assert alpha.get(f"/v1/sessions/{sid}").status_code == 404


BAD_REQUESTS = [
    ("POST", "/v1/sessions", b"{not json", 422),
    ("POST", "/v1/sessions", b'{"profile": 5}', 422),
    ("POST", "/v1/sessions", b'{"profile": "nope"}', 400),
    ("POST", "/v1/sessions", b'{"unknown_field": 1}', 422),
    ("POST", "/v1/sessions", b'{"timeout_s": -1}', 422),
    ("POST", "/v1/sessions", b'{"env": {"1BAD": "x"}}', 422),
    ("POST", "/v1/sessions", b'{"env": {"A": 5}}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": 5}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": "1", "timeout_s": 0}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": "1", "timeout_s": -5}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": "1", "timeout_s": 1e12}', 400),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": "1", "timeout_s": "x"}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b'{"code": "1", "extra": true}', 422),
    ("POST", "/v1/sessions/{sid}/execute", b"[]", 422),
    ("POST", "/v1/sessions/{sid}/execute", b"\xff\xfe", 422),
    ("POST", "/v1/sessions/does-not-exist/execute", b'{"code": "1"}', 404),
    ("GET", "/v1/sessions/does-not-exist", b"", 404),
    ("DELETE", "/v1/sessions/does-not-exist", b"", 404),
]


@pytest.mark.parametrize(("method", "path", "body", "expected"), BAD_REQUESTS)
def test_bad_input_gets_4xx_with_detail(alpha: httpx.Client, session_id: str, method: str,
                                        path: str, body: bytes, expected: int) -> None:
    answer = alpha.request(method, path.format(sid=session_id), content=body,
                           headers={"content-type": "application/json"})
    assert answer.status_code == expected, answer.text
    assert answer.json()["detail"]


def test_oversize_code_is_refused(alpha: httpx.Client, session_id: str) -> None:
    answer = alpha.post(f"/v1/sessions/{session_id}/execute",
                        json={"code": "#" * 1_000_001})
    assert answer.status_code == 413 and "limit" in answer.json()["detail"]


def test_audit_verify_passes_and_export_lists_code(gateway: GatewayProcess, alpha: httpx.Client,
                                                   session_id: str) -> None:
    run(alpha, session_id, "audited = 'secret-sauce-42'")
    run(alpha, session_id, "1")  # executions run in order: the first one's record is appended
    time.sleep(0.5)
    env = {**gateway.env}
    verify = subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "verify"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    export = subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "export"], env=env,
                            capture_output=True, text=True, timeout=60)
    records = [json.loads(line) for line in export.stdout.splitlines() if line.strip()]
    codes = [r.get("record", r).get("code") for r in records]
    assert "audited = 'secret-sauce-42'" in codes
    image = records[codes.index("audited = 'secret-sauce-42'")].get("record", {}).get("image")
    assert "@sha256:" in image, "the audit record names the image by digest"


def test_audit_records_after_a_cli_read_reach_the_database(
        gateway: GatewayProcess, alpha: httpx.Client, session_id: str) -> None:
    # `replgate audit` opens the database read-write in a second process and closes it. If the
    # gateway had dropped SQLite's locks on the file (a descriptor of it closed in its own
    # process), that close would delete the WAL under the gateway and every record appended
    # after it would go to an unlinked file: lost, and the chain reported TAMPERED.
    env = {**gateway.env}
    cli = [sys.executable, "-m", "gateway.cli", "audit"]
    subprocess.run([*cli, "export"], env=env, capture_output=True, text=True, timeout=60,
                   check=True)
    run(alpha, session_id, "after_cli_read = 'audit-after-cli-73'")
    run(alpha, session_id, "1")  # executions run in order: the first one's record is appended
    deadline = time.monotonic() + 10
    while True:
        codes = [record["code"] for record in gateway.audit_records()]
        if "after_cli_read = 'audit-after-cli-73'" in codes or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "after_cli_read = 'audit-after-cli-73'" in codes
    verify = subprocess.run([*cli, "verify"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
