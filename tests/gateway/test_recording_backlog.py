"""A gateway answers an execution before it writes its records (history, audit), and keeps
that backlog bounded when its database falls behind (REPLGATE_MAX_UNRECORDED_EXECUTIONS).

The database falls behind for real: the test holds the gateway's SQLite file's write lock, so
every record waits (the gateway tries again while the database is busy). SQLite only: the
PostgreSQL leg does not run this file.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import docker
import httpx

from tests.conftest import running_gateway

BOUND = 1
"""REPLGATE_MAX_UNRECORDED_EXECUTIONS here; new executions are refused at four times it."""


def test_answers_wait_for_their_records_then_new_executions_are_refused(
        docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client, max_unrecorded_executions=str(BOUND), min_idle="2"
                         ) as gateway, \
            httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=120) as c:
        sids = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(4)]
        database = sqlite3.connect(gateway.state_dir / "replgate.db", timeout=30,
                                   isolation_level=None)
        waiting = ThreadPoolExecutor(max_workers=3)
        try:
            database.execute("BEGIN IMMEDIATE")  # every write of the gateway waits from now
            first = c.post(f"/v1/sessions/{sids[0]}/execute", json={"code": "1"})
            assert first.status_code == 200 and first.json()["status"] == "ok", first.text
            # Past the bound, an answer waits for its own records.
            answers = [waiting.submit(c.post, f"/v1/sessions/{sid}/execute",
                                      json={"code": "2"}) for sid in sids[1:]]
            deadline = time.monotonic() + 60
            while not all(c.get(f"/v1/sessions/{sid}").json()["execution_count"] == 1
                          for sid in sids[1:]):
                assert time.monotonic() < deadline, "the executions did not run"
                time.sleep(0.05)
            time.sleep(0.5)
            assert not any(answer.done() for answer in answers), "answered before recorded"
            # Four times the bound finished and unrecorded: a new execution is refused.
            refused = c.post(f"/v1/sessions/{sids[0]}/execute", json={"code": "3"})
            assert refused.status_code == 429, refused.text
            assert "REPLGATE_MAX_UNRECORDED_EXECUTIONS" in refused.json()["detail"]
            assert refused.headers["retry-after"]
        finally:
            database.execute("ROLLBACK")
            database.close()
            waiting.shutdown(wait=True)
        for answer in answers:
            assert answer.result().status_code == 200
            assert answer.result().json()["status"] == "ok"
        # All recorded; the refused one never ran.
        for sid, code in zip(sids, ["1", "2", "2", "2"], strict=True):
            history = c.get(f"/v1/sessions/{sid}/executions").json()
            assert [h["code"] for h in history] == [code]
            assert history[0]["status"] == "ok"
        assert c.get(f"/v1/sessions/{sids[0]}").json()["execution_count"] == 1
        # The backlog gone, executions are answered at once again.
        assert c.post(f"/v1/sessions/{sids[0]}/execute", json={"code": "4"}).status_code == 200
