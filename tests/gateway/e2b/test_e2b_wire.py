"""The E2B wire as raw HTTP: error shapes, routing headers, the NDJSON stream, Connect errors.

No request, however wrong, gets a 500 or hangs; each gets E2B's shape with a sentence.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import GatewayProcess


@pytest.fixture(scope="module")
def api(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{gateway.url}/e2b", timeout=60,
                      headers={"X-API-Key": gateway.keys["alpha"]}) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(api: httpx.Client) -> Iterator[dict[str, str]]:
    created = api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300})
    assert created.status_code == 201, created.text
    body = created.json()
    yield body
    api.delete(f"/sandboxes/{body['sandboxID']}")


def sandbox_headers(sandbox: dict[str, str], port: int = 49983) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": str(port),
            "X-Access-Token": sandbox["envdAccessToken"]}


def test_create_answers_e2bs_sandbox_fields(sandbox: dict[str, str]) -> None:
    assert sandbox["templateID"] == "default"
    assert sandbox["envdVersion"]
    assert sandbox["envdAccessToken"] == sandbox["trafficAccessToken"]


@pytest.mark.parametrize("body", [
    # What each release sends unasked, as recorded from it: e2b 2.7.0 (Python), 2.7.0 (JS),
    # 2.45.1 (Python), 2.45.0 (JS); the newest send only templateID.
    {"templateID": "base", "allow_internet_access": True, "autoPause": False, "envVars": {},
     "metadata": {}, "secure": True, "timeout": 300},
    {"autoPause": False, "templateID": "base", "timeout": 300, "secure": True,
     "allow_internet_access": True},
    {"templateID": "base", "timeout": 300, "secure": True, "allow_internet_access": True,
     "metadata": {}, "envVars": {}},
    {"templateID": "base", "timeout": 300, "secure": True, "allow_internet_access": True},
    # E2B's code-interpreter suite's ask, and its opposite.
    {"templateID": "base", "secure": True, "network": {"allowPublicTraffic": False}},
    {"templateID": "base", "network": {"allowPublicTraffic": True, "allowOut": [],
                                       "denyOut": None}},
])
def test_an_sdks_defaults_create_and_the_answer_says_what_the_sandbox_got(
        api: httpx.Client, body: dict[str, object]) -> None:
    created = api.post("/sandboxes", json=body)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    try:
        nothing = {"allowPublicTraffic": False, "allowOut": [], "denyOut": ["0.0.0.0/0"]}
        assert created.json()["allowInternetAccess"] is False
        assert created.json()["network"] == nothing
        detail = api.get(f"/sandboxes/{sandbox_id}").json()
        assert detail["allowInternetAccess"] is False and detail["network"] == nothing
        assert detail["lifecycle"] == {"onTimeout": "kill", "autoResume": False}
    finally:
        api.delete(f"/sandboxes/{sandbox_id}")


def test_network_options_that_cannot_map_are_400_naming_them(api: httpx.Client) -> None:
    answer = api.post("/sandboxes", json={"templateID": "base", "network": {
        "denyOut": ["10.0.0.0/8"], "maskRequestHost": "x"}})
    assert answer.status_code == 400
    assert "network options maskRequestHost" in answer.json()["message"]


@pytest.mark.parametrize(("network", "named"), [
    ({"allowOut": ["1.1.1.1"]}, "'default': 'allow' is wider than this profile allows"),
    ({"allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"]}, "allow entry '1.1.1.1' is beyond"),
])
def test_network_wider_than_the_profile_is_403_naming_the_entry(
        api: httpx.Client, network: dict[str, object], named: str) -> None:
    answer = api.post("/sandboxes", json={"templateID": "base", "network": network})
    assert answer.status_code == 403
    assert named in answer.json()["message"]


def test_closing_the_network_maps_onto_a_policy(api: httpx.Client) -> None:
    for body in ({"network": {"denyOut": ["0.0.0.0/0"]}}, {"allow_internet_access": False}):
        created = api.post("/sandboxes", json={"templateID": "base", **body})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        try:
            assert created.json()["network"]["denyOut"] == ["0.0.0.0/0"]
            assert api.get(f"/sandboxes/{sandbox_id}").json()["allowInternetAccess"] is False
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")


def test_missing_key_is_401_in_e2b_shape(gateway: GatewayProcess) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandboxes", json={"templateID": "base"})
    assert answer.status_code == 401
    assert answer.json()["code"] == 401 and "E2B_API_KEY" in answer.json()["message"]


@pytest.mark.parametrize("body", [b"{not json", b'{"templateID": 5}', b"[]", b""])
def test_malformed_create_is_400_in_e2b_shape(api: httpx.Client, body: bytes) -> None:
    answer = api.post("/sandboxes", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code in (400, 422)
    assert set(answer.json()) >= {"code", "message"}


def test_unknown_template_is_404_naming_the_profiles(api: httpx.Client) -> None:
    answer = api.post("/sandboxes", json={"templateID": "desktop"})
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "message": answer.json()["message"]}
    assert "profiles are default" in answer.json()["message"]


def test_paths_not_offered_are_404_with_a_sentence(api: httpx.Client) -> None:
    answer = api.get("/volumes")
    assert answer.status_code == 404
    assert "does not offer GET /volumes" in answer.json()["message"]


def test_other_tenants_sandbox_is_404(gateway: GatewayProcess,
                                      sandbox: dict[str, str]) -> None:
    answer = httpx.get(f"{gateway.url}/e2b/sandboxes/{sandbox['sandboxID']}",
                       headers={"X-API-Key": gateway.keys["beta"]})
    assert answer.status_code == 404


def test_sandbox_plane_refuses_wrong_token_unknown_sandbox_and_closed_port(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    url = f"{gateway.url}/e2b/sandbox/health"
    good = sandbox_headers(sandbox)
    assert httpx.get(url, headers=good).status_code == 204
    wrong = httpx.get(url, headers={**good, "X-Access-Token": "rgt_wrong"})
    assert wrong.status_code == 401
    unknown = httpx.get(url, headers={**good, "E2b-Sandbox-Id": "no-such-sandbox"})
    assert unknown.status_code == 502 and "was not found" in unknown.text
    closed = httpx.get(url, headers={**good, "E2b-Sandbox-Port": "8080"})
    assert closed.status_code == 502 and "is not open" in closed.text
    bare = httpx.get(url)
    assert bare.status_code == 400 and "E2b-Sandbox-Id" in bare.text


def test_a_token_names_its_sandbox_for_requests_without_the_headers(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    """E2B's JS SDK before 2.15 sends /files and /health with the access token only."""
    token = {"X-Access-Token": sandbox["envdAccessToken"]}
    url = f"{gateway.url}/e2b/sandbox"
    written = httpx.post(f"{url}/files", params={"path": "/home/user/bare.txt"}, content=b"hi",
                         headers={**token, "Content-Type": "application/octet-stream"})
    assert written.status_code == 200, written.text
    read = httpx.get(f"{url}/files", params={"path": "/home/user/bare.txt"}, headers=token)
    assert read.content == b"hi"
    assert httpx.get(f"{url}/health", headers=token).status_code == 200
    forged = sandbox["envdAccessToken"].replace(sandbox["sandboxID"], "another")
    assert httpx.get(f"{url}/health", headers={"X-Access-Token": forged}).status_code == 502


def test_a_token_given_before_tokens_named_sandboxes_still_opens_it(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    key = (gateway.state_dir / "e2b_token_key").read_bytes()
    mac = hmac.new(key, sandbox["sandboxID"].encode(), hashlib.sha256).digest()
    old = "rgt_" + base64.urlsafe_b64encode(mac).decode().rstrip("=")
    answer = httpx.get(f"{gateway.url}/e2b/sandbox/health",
                       headers={**sandbox_headers(sandbox), "X-Access-Token": old})
    assert answer.status_code == 204


def test_execute_streams_ndjson_ending_with_end_of_execution(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    with httpx.stream("POST", f"{gateway.url}/e2b/sandbox/execute",
                      json={"code": "print('a')\n6 * 7"},
                      headers=sandbox_headers(sandbox, 49999), timeout=60) as answer:
        assert answer.status_code == 200
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    types = [line["type"] for line in lines]
    assert types[-1] == "end_of_execution"
    assert {"type": "stdout", "text": "a\n"}.items() <= lines[types.index("stdout")].items()
    result = lines[types.index("result")]
    assert result["text"] == "42" and result["is_main_result"] is True
    assert lines[types.index("number_of_executions")]["execution_count"] >= 1


def test_execute_of_a_silent_cell_answers_headers_then_keepalives(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}/e2b/sandbox/execute",
                      json={"code": "import time\ntime.sleep(2.5)"},
                      headers=sandbox_headers(sandbox, 49999), timeout=60) as answer:
        headers_after = time.monotonic() - started
        types = [json.loads(line)["type"] for line in answer.iter_lines() if line]
    assert headers_after < 2  # a client's request timeout runs until the headers come
    assert types[0] == "keepalive" and types[-1] == "end_of_execution"


@pytest.mark.parametrize("body", [b"{bad", b'{"code": 7}', b"[]", b"\xff"])
def test_execute_bad_bodies_are_400_sentences(gateway: GatewayProcess,
                                              sandbox: dict[str, str], body: bytes) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/execute", content=body,
                        headers=sandbox_headers(sandbox, 49999))
    assert answer.status_code == 400 and "invalid request" in answer.text


def test_execute_refuses_a_language_the_image_lacks_naming_those_it_has(
        gateway: GatewayProcess, sandbox: dict[str, str]) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/execute",
                        json={"code": "1", "language": "cobol"},
                        headers=sandbox_headers(sandbox, 49999))
    assert answer.status_code == 400
    assert "offers: python, bash, r, javascript, java, typescript" in answer.text


@pytest.mark.parametrize("method,body", [
    ("Stat", b"{bad"), ("Stat", b'{"path": 7}'), ("ListDir", b'{"depth": "x"}'),
    ("NoSuchMethod", b"{}"),
])
def test_connect_bad_requests_are_connect_errors_not_500(
        gateway: GatewayProcess, sandbox: dict[str, str], method: str, body: bytes) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/filesystem.Filesystem/{method}",
                        content=body, headers={**sandbox_headers(sandbox),
                                               "Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.text


@pytest.mark.parametrize("method,body,code", [
    ("SendSignal", b'{"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}', "not_found"),
    ("SendSignal", b'{"process": {"pid": "x"}}', "invalid_argument"),
    ("SendInput", b'{"process": {"pid": 1}, "input": {"stdin": "eA=="}}', "not_found"),
    ("SendInput", b'{"process": {"pid": 1}, "input": {"stdin": "not base64!"}}',
     "invalid_argument"),
    ("CloseStdin", b'{"process": {"pid": 1}}', "not_found"),
    ("Update", b"{}", "not_found"),
    ("Update", b'{"process": {"pid": 1}}', "invalid_argument"),
    ("Update", b'{"process": {"pid": 1}, "pty": {"size": {"cols": 0, "rows": 5}}}',
     "invalid_argument"),
])
def test_process_refusals_are_connect_errors_with_a_sentence(
        gateway: GatewayProcess, sandbox: dict[str, str], method: str, body: bytes,
        code: str) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/process.Process/{method}", content=body,
                        headers={**sandbox_headers(sandbox), "Content-Type": "application/json"})
    assert 400 <= answer.status_code < 600 and answer.status_code != 500, answer.text
    assert answer.json()["code"] == code and answer.json()["message"]


@pytest.mark.parametrize("process,why", [
    ({"process": {"cmd": "/bin/bash", "args": ["-c", "true"]},
      "pty": {"size": {"cols": 0, "rows": 24}}}, "cols"),
    ({"process": {"cmd": ""}}, "cmd is empty"),
])
def test_process_start_refusal_ends_the_stream_with_a_sentence(
        gateway: GatewayProcess, sandbox: dict[str, str], process: dict[str, object],
        why: str) -> None:
    message = json.dumps(process).encode()
    envelope = b"\x00" + len(message).to_bytes(4, "big") + message
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/process.Process/Start", content=envelope,
                        headers={**sandbox_headers(sandbox),
                                 "Content-Type": "application/connect+json"}, timeout=30)
    assert answer.status_code == 200, answer.text  # Connect streams say errors in their end
    end = json.loads(answer.content[5:])
    assert why in end["error"]["message"]


def test_connect_stat_answers_protojson(gateway: GatewayProcess,
                                        sandbox: dict[str, str]) -> None:
    answer = httpx.post(f"{gateway.url}/e2b/sandbox/filesystem.Filesystem/Stat",
                        json={"path": "/home/user"},
                        headers={**sandbox_headers(sandbox), "Connect-Protocol-Version": "1"})
    assert answer.status_code == 200, answer.text
    entry = answer.json()["entry"]
    assert entry["type"] == "FILE_TYPE_DIRECTORY" and entry["path"] == "/home/user"
    assert entry["modifiedTime"].endswith("Z")
    missing = httpx.post(f"{gateway.url}/e2b/sandbox/filesystem.Filesystem/Stat",
                         json={"path": "nope"}, headers=sandbox_headers(sandbox))
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_pause_then_connect_resumes_with_variables(api: httpx.Client,
                                                   gateway: GatewayProcess) -> None:
    created = api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300}).json()
    sid = created["sandboxID"]
    try:
        with httpx.Client(base_url=gateway.url, headers=gateway.headers("alpha"),
                          timeout=120) as rg:
            rg.post(f"/v1/sessions/{sid}/execute", json={"code": "kept = 7"})
            assert api.post(f"/sandboxes/{sid}/pause").status_code == 204
            assert api.get(f"/sandboxes/{sid}").json()["state"] == "paused"
            assert api.post(f"/sandboxes/{sid}/resume", json={}).status_code in (200, 201)
            assert api.get(f"/sandboxes/{sid}").json()["state"] == "running"
            out = rg.post(f"/v1/sessions/{sid}/execute", json={"code": "kept"}).json()
            assert out["outputs"][0]["data"]["text/plain"] == "7"
    finally:
        api.delete(f"/sandboxes/{sid}")
