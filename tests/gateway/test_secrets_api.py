"""Tenants' secrets through the API (``/v1/secrets``): stored sealed, listed without values,
replaced, deleted, another tenant's absent; bad input a clear 4xx that never echoes a value;
and no byte of a value in the gateway's log, its database or its audit log."""

from __future__ import annotations

import base64
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator

import docker
import httpx
import pytest
from pydantic import SecretStr

from gateway.secrets import SecretBox
from tests.conftest import GatewayProcess, make_gateway, running_gateway
from tests.otlp_receiver import OtlpReceiver

KEY = base64.b64encode(os.urandom(32)).decode()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def keyed(docker_client: docker.DockerClient,
          receiver: OtlpReceiver) -> Iterator[GatewayProcess]:
    process = make_gateway(secrets_key=KEY, log_level="debug")
    process.env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                        "OTEL_SERVICE_NAME": "replgate-test", "OTEL_TRACES_SAMPLER": "always_on",
                        "OTEL_BSP_SCHEDULE_DELAY": "100"})
    with running_gateway(docker_client, process) as gateway:
        yield gateway


@pytest.fixture
def alpha(keyed: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed.url, timeout=60, headers=keyed.headers("alpha")) as c:
        yield c


def _database_bytes(process: GatewayProcess) -> bytes:
    if process.database_url is not None:
        from tests.conftest import postgres_admin

        with postgres_admin(process.database_url) as db:
            return repr(list(db.execute("SELECT * FROM secrets"))).encode()
    path = process.state_dir / "replgate.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = list(db.execute("SELECT * FROM secrets"))
    return repr(rows).encode() + b"".join(p.read_bytes() for p in path.parent.glob("replgate.db*"))


def test_put_list_replace_delete(alpha: httpx.Client, keyed: GatewayProcess) -> None:
    value = f"sk-first-{secrets.token_hex(12)}"
    assert alpha.put("/v1/secrets/OPENAI", json={"value": value}).status_code == 204
    listed = alpha.get("/v1/secrets").json()
    assert [s["name"] for s in listed] == ["OPENAI"]
    assert set(listed[0]) == {"name", "created_at", "updated_at"}
    first = listed[0]

    newer = f"sk-second-{secrets.token_hex(12)}"
    assert alpha.put("/v1/secrets/OPENAI", json={"value": newer}).status_code == 204
    again = alpha.get("/v1/secrets").json()[0]
    assert again["created_at"] == first["created_at"]
    assert again["updated_at"] > first["updated_at"]

    assert alpha.delete("/v1/secrets/OPENAI").status_code == 204
    assert alpha.get("/v1/secrets").json() == []
    gone = alpha.delete("/v1/secrets/OPENAI")
    assert gone.status_code == 404 and "OPENAI" in gone.json()["detail"]


def test_another_tenant_sees_nothing(alpha: httpx.Client, keyed: GatewayProcess) -> None:
    assert alpha.put("/v1/secrets/MINE", json={"value": "v-" + secrets.token_hex(8)}
                     ).status_code == 204
    with httpx.Client(base_url=keyed.url, timeout=60, headers=keyed.headers("beta")) as beta:
        assert beta.get("/v1/secrets").json() == []
        assert beta.delete("/v1/secrets/MINE").status_code == 404
    alpha.delete("/v1/secrets/MINE")


@pytest.mark.parametrize(("name", "body", "status"), [
    ("bad name", {"value": "x"}, 400),
    ("{secret:X}", {"value": "x"}, 400),
    ("OK", {"value": ""}, 400),
    ("OK", {"value": "line\r\nX-Injected: 1"}, 400),
    ("OK", {"value": "x" * 9000}, 400),
    ("OK", {"value": "x", "extra": 1}, 422),
    ("OK", {}, 422),
])
def test_bad_input_is_a_clear_4xx(alpha: httpx.Client, name: str, body: dict[str, object],
                                  status: int) -> None:
    answer = alpha.put(f"/v1/secrets/{name}", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]
    assert "X-Injected" not in answer.text and "x" * 100 not in answer.text


def test_no_value_in_log_database_audit_or_spans(alpha: httpx.Client, keyed: GatewayProcess,
                                                 receiver: OtlpReceiver) -> None:
    value = f"never-seen-{secrets.token_hex(16)}"
    assert alpha.put("/v1/secrets/HIDDEN", json={"value": value}).status_code == 204
    answer = alpha.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    sid = answer.json()["id"]
    out = alpha.post(f"/v1/sessions/{sid}/execute", json={"code": "print('hello')"})
    assert out.status_code == 200
    alpha.delete(f"/v1/sessions/{sid}")

    assert value.encode() not in keyed.log_path.read_bytes()
    assert value.encode() not in _database_bytes(keyed)
    assert value not in repr(keyed.audit_records())
    assert "HIDDEN" in repr(_database_bytes(keyed))  # the row is there, sealed
    deadline = time.monotonic() + 10
    while not any("/v1/secrets" in span.name for span in receiver.snapshot()):
        assert time.monotonic() < deadline, "no span of PUT /v1/secrets arrived"
        time.sleep(0.1)
    assert not any(value.encode() in body for body in receiver.bodies)


def test_without_a_key_the_api_answers_409(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.url, timeout=60, headers=gateway.headers()) as c:
        answer = c.put("/v1/secrets/X", json={"value": "v"})
        assert answer.status_code == 409
        assert "REPLGATE_SECRETS_KEY" in answer.json()["detail"]
        assert c.get("/v1/secrets").json() == []


def test_a_sealed_value_opens_only_for_its_tenant_name_and_key() -> None:
    box = SecretBox(SecretStr(KEY))
    sealed = box.seal("alpha", "A", "value-1")
    assert "value-1" not in sealed
    assert box.open("alpha", "A", sealed) == "value-1"
    for tenant, name in (("beta", "A"), ("alpha", "B")):
        with pytest.raises(ValueError, match="does not open"):
            box.open(tenant, name, sealed)
    other = SecretBox(SecretStr(base64.b64encode(os.urandom(32)).decode()))
    with pytest.raises(ValueError, match="does not open"):
        other.open("alpha", "A", sealed)


@pytest.mark.parametrize("key", ["not base64!", base64.b64encode(b"short").decode()])
def test_a_bad_key_setting_is_refused(key: str) -> None:
    from common.settings import Settings

    with pytest.raises(ValueError, match="REPLGATE_SECRETS_KEY") as caught:
        Settings(secrets_key=key)
    assert key not in str(caught.value)
