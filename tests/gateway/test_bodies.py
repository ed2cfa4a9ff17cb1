"""Request bodies on a running gateway: JSON whatever the Content-Type, optional where it may be."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import GatewayProcess

FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends


def test_create_session_without_body_uses_defaults(alpha: httpx.Client) -> None:
    answer = alpha.post("/v1/sessions")
    assert answer.status_code == 201, answer.text
    try:
        assert answer.json()["profile"] == "default"
        assert answer.json()["metadata"] == {}
    finally:
        alpha.delete(f"/v1/sessions/{answer.json()['id']}")


def test_create_session_with_form_typed_json_reads_json(alpha: httpx.Client) -> None:
    answer = alpha.post("/v1/sessions", content=b'{"metadata": {"via": "curl"}}', headers=FORM)
    assert answer.status_code == 201, answer.text
    try:
        assert answer.json()["metadata"] == {"via": "curl"}
    finally:
        alpha.delete(f"/v1/sessions/{answer.json()['id']}")


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain",
                                          "multipart/form-data; boundary=x", None])
def test_execute_with_any_content_type_reads_json(alpha: httpx.Client, session_id: str,
                                                  content_type: str | None) -> None:
    request = alpha.build_request("POST", f"/v1/sessions/{session_id}/execute",
                                  content=b'{"code": "print(21 * 2)"}')
    if content_type is None:
        request.headers.pop("Content-Type", None)  # httpx sends none for raw bytes
    else:
        request.headers["Content-Type"] = content_type
    answer = alpha.send(request)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "42\n"


@pytest.mark.parametrize("body", [b"code=print(1)", b'{"code": "print(1)"', b"\xff\xfe{}"])
def test_execute_with_body_not_json_is_422_with_sentence(alpha: httpx.Client, session_id: str,
                                                         body: bytes) -> None:
    answer = alpha.post(f"/v1/sessions/{session_id}/execute", content=body, headers=FORM)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and detail.startswith("the request body is not JSON")


def test_execute_with_json_of_wrong_shape_is_still_a_validation_error(
        alpha: httpx.Client, session_id: str) -> None:
    answer = alpha.post(f"/v1/sessions/{session_id}/execute", content=b'{"cod": 1}', headers=FORM)
    assert answer.status_code == 422, answer.text
    assert any(error["loc"][-1] == "code" for error in answer.json()["detail"])


def test_upload_of_bytes_that_are_not_json_keeps_them(alpha: httpx.Client,
                                                      session_id: str) -> None:
    data = b"a=1&b={not json\xff"
    answer = alpha.put(f"/v1/sessions/{session_id}/files/form.bin", content=data, headers=FORM)
    assert answer.status_code == 201, answer.text
    assert alpha.get(f"/v1/sessions/{session_id}/files/form.bin").content == data


def test_body_without_key_is_still_401(gateway: GatewayProcess, session_id: str) -> None:
    answer = httpx.post(f"{gateway.url}/v1/sessions/{session_id}/execute",
                        content=b'{"code": "1"}', headers=FORM)
    assert answer.status_code == 401, answer.text
