"""Snapshots through the native API (``/v1/sessions/{id}/snapshots``, ``/v1/snapshots``): a
session saved while it goes on, sessions made from it by id or name, listed, described and
deleted; bad input answered with a clear 4xx, another tenant's snapshots absent; and a
paused session saved without being resumed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import GatewayProcess


@pytest.fixture
def alpha(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120, headers=gateway.headers("alpha")) as c:
        yield c


@pytest.fixture
def session_id(alpha: httpx.Client) -> Iterator[str]:
    answer = alpha.post("/v1/sessions", json={"env": {"STAGE": "one"}})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["id"]
    yield sid
    alpha.delete(f"/v1/sessions/{sid}")


def _run(client: httpx.Client, session_id: str, code: str) -> str:
    answer = client.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["stdout"])


def test_a_snapshot_is_saved_listed_used_and_deleted(alpha: httpx.Client,
                                                     session_id: str) -> None:
    _run(alpha, session_id, "x = 41")
    alpha.put(f"/v1/sessions/{session_id}/files/notes.txt", content=b"saved")
    answer = alpha.post(f"/v1/sessions/{session_id}/snapshots", json={"name": "api-first"})
    assert answer.status_code == 201, answer.text
    snapshot = answer.json()
    assert snapshot["id"].startswith("snap_") and snapshot["name"] == "api-first"
    assert snapshot["session_id"] == session_id and snapshot["profile"] == "default"
    assert snapshot["memory"] is True and "x" in snapshot["kept"]
    assert "processes" in snapshot["not_kept"] and snapshot["size_bytes"] > 0
    assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "idle"  # goes on
    _run(alpha, session_id, "x = 0")

    assert [s["id"] for s in alpha.get("/v1/snapshots").json()] == [snapshot["id"]]
    assert [s["id"] for s in alpha.get("/v1/snapshots", params={"name": "api-first"}).json()
            ] == [snapshot["id"]]
    assert alpha.get("/v1/snapshots", params={"session_id": "nope"}).json() == []
    assert alpha.get("/v1/snapshots/api-first").json()["id"] == snapshot["id"]

    made = alpha.post("/v1/snapshots/api-first/sessions", json={"env": {"EXTRA": "2"}})
    assert made.status_code == 201, made.text
    copy = made.json()
    try:
        assert copy["status"] == "paused" and copy["tenant"] == "alpha"
        assert _run(alpha, copy["id"], "import os; print(x + 1, os.environ['STAGE'], "
                    "os.environ['EXTRA'])") == "42 one 2\n"
        assert alpha.get(f"/v1/sessions/{copy['id']}/files/notes.txt").content == b"saved"
        assert alpha.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
        assert alpha.get("/v1/snapshots").json() == []
        assert _run(alpha, copy["id"], "print(x)") == "41\n"  # the copy goes on
    finally:
        alpha.delete(f"/v1/sessions/{copy['id']}")
    gone = alpha.post(f"/v1/snapshots/{snapshot['id']}/sessions")
    assert gone.status_code == 404 and snapshot["id"] in gone.json()["detail"]
    assert alpha.delete("/v1/snapshots/api-first").status_code == 404


def test_a_paused_session_is_saved_as_it_was_kept(alpha: httpx.Client,
                                                  session_id: str) -> None:
    _run(alpha, session_id, "y = 'paused'")
    assert alpha.post(f"/v1/sessions/{session_id}/pause").status_code == 200
    answer = alpha.post(f"/v1/sessions/{session_id}/snapshots")
    assert answer.status_code == 201, answer.text
    snapshot = answer.json()
    try:
        assert snapshot["name"] is None and "y" in snapshot["kept"]
        assert alpha.get(f"/v1/sessions/{session_id}").json()["status"] == "paused"
        copy = alpha.post(f"/v1/snapshots/{snapshot['id']}/sessions").json()
        try:
            assert _run(alpha, copy["id"], "print(y)") == "paused\n"
        finally:
            alpha.delete(f"/v1/sessions/{copy['id']}")
    finally:
        alpha.delete(f"/v1/snapshots/{snapshot['id']}")


def test_bad_requests_and_other_tenants_get_a_clear_4xx(
        alpha: httpx.Client, session_id: str, gateway: GatewayProcess) -> None:
    for name, words in [("default", "is a profile's"), ("snap_x", "not with 'snap_'"),
                        ("a b", "letters, digits")]:
        answer = alpha.post(f"/v1/sessions/{session_id}/snapshots", json={"name": name})
        assert answer.status_code == 400 and words in answer.json()["detail"], answer.text
    assert alpha.post(f"/v1/sessions/{session_id}/snapshots",
                      json={"memory": "sometimes"}).status_code == 422
    assert alpha.post(f"/v1/sessions/{session_id}/snapshots",
                      json={"colour": "red"}).status_code == 422
    assert alpha.post("/v1/sessions/nope/snapshots").status_code == 404
    assert alpha.get("/v1/snapshots/snap_nothing").status_code == 404

    snapshot = alpha.post(f"/v1/sessions/{session_id}/snapshots").json()
    try:
        with httpx.Client(base_url=gateway.url, timeout=60,
                          headers=gateway.headers("beta")) as beta:
            assert beta.get("/v1/snapshots").json() == []
            assert beta.get(f"/v1/snapshots/{snapshot['id']}").status_code == 404
            assert beta.post(f"/v1/snapshots/{snapshot['id']}/sessions").status_code == 404
            assert beta.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 404
            assert beta.post(f"/v1/sessions/{session_id}/snapshots").status_code == 404
    finally:
        assert alpha.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
