"""Governance and E2B lifetimes on many machines: state that lived in one gateway's memory now
lives in the shared database, so it holds whichever gateway a request reaches.

A cluster of one node and two gateways (real PostgreSQL, mutual TLS: cluster_support) with a
policy file and approver keys: an execution held through one gateway is approved through the
other; a budget counts executions run through both, one after another or at once; an E2B
sandbox made through a gateway that is then killed -9 still ends at its timeout, ended by the
other.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import pytest
from cluster_support import (
    ADMIN_KEY,
    Cluster,
    create_session,
    execute,
    gateway_client,
    running_cluster,
)
from e2b_code_interpreter import AsyncSandbox

APPROVER = f"approver-alice-{secrets.token_hex(8)}"
BUDGET = 3
SESSIONS_PER_TENANT = 2

POLICY = f"""
[[rules]]
id = "ask-first"
action = "approve"
strings = ["*needs-approval*"]
message = "a person must approve this"

[defaults]
rules = ["ask-first"]

[tenants.beta.budgets]
max_executions = {BUDGET}
"""


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient) -> Iterator[Cluster]:
    policy = Path(tempfile.mkdtemp(prefix="rg-pol-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY)
    settings = {"policy_file": str(policy), "approval_timeout_s": "60",
                "max_sessions_per_tenant": str(SESSIONS_PER_TENANT),
                "approver_keys": f"alpha:alice:{APPROVER}"}
    with running_cluster(docker_client, nodes=1, gateway_settings=settings) as started:
        yield started


async def test_held_through_one_gateway_approved_through_the_other_runs(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["alpha"]
    async with gateway_client(one, key=key) as first, gateway_client(two, key=key) as second, \
            gateway_client(two, key=APPROVER) as approver_there, \
            gateway_client(one, key=APPROVER) as approver_here:
        sid = (await create_session(first))["id"]
        try:
            held = asyncio.ensure_future(execute(first, sid, "'needs-approval'\nprint('ran')"))
            deadline = time.monotonic() + 30
            pending: list[dict[str, Any]] = []
            while not pending and time.monotonic() < deadline:
                listed = await second.get("/v1/approvals")  # listed by the other gateway
                assert listed.status_code == 200, listed.text
                pending = [a for a in listed.json() if a["session_id"] == sid]
                await asyncio.sleep(0.1)
            assert pending and pending[0]["rules"][0]["rule"] == "ask-first"
            approval_id = pending[0]["approval_id"]
            assert not held.done()
            decided_at = time.monotonic()
            decided = await approver_there.post(f"/v1/approvals/{approval_id}/approve",
                                                json={"comment": "fine"})
            assert decided.status_code == 200, decided.text
            assert decided.json()["status"] == "approved"
            result = await asyncio.wait_for(held, 30)
            assert result["status"] == "ok" and result["stdout"] == "ran\n", result
            assert time.monotonic() - decided_at < 5  # learnt by a poll, not at expiry
            # Decided once, for every gateway.
            again = await approver_here.post(f"/v1/approvals/{approval_id}/reject")
            assert again.status_code == 409 and "approved" in again.json()["detail"]
            shown = (await first.get(f"/v1/approvals/{approval_id}")).json()
            assert (shown["status"], shown["decided_by"], shown["comment"]) == (
                "approved", "alice", "fine")
            assert (await first.get("/v1/approvals")).json() == []
        finally:
            await first.delete(f"/v1/sessions/{sid}")


async def test_a_tenant_at_its_session_limit_is_refused_through_either_gateway(
        cluster: Cluster) -> None:
    """The limit counts the tenant's sessions in the shared database, beside the claim of a
    node's slot: a session more than the limit, through the gateway that made none of them,
    is refused with a 429 that says what to do, and the slot it claimed is given back."""
    one, two = cluster.gateways
    key = one.keys["alpha"]
    async with gateway_client(one, key=key) as first, gateway_client(two, key=key) as second, \
            gateway_client(two, key=ADMIN_KEY) as ops:
        made = [(await create_session(first))["id"] for _ in range(SESSIONS_PER_TENANT)]
        try:
            taken = [n["sessions"] for n in (await ops.get("/v1/nodes")).json()]
            refused = await second.post("/v1/sessions", json={})
            assert refused.status_code == 429, refused.text
            assert "REPLGATE_MAX_SESSIONS_PER_TENANT" in refused.json()["detail"]
            assert [n["sessions"] for n in (await ops.get("/v1/nodes")).json()] == taken
            assert len((await second.get("/v1/sessions")).json()) == SESSIONS_PER_TENANT
            assert (await second.delete(f"/v1/sessions/{made.pop()}")).status_code == 204
            made.append((await create_session(second))["id"])  # room again
        finally:
            for sid in made:
                await first.delete(f"/v1/sessions/{sid}")


async def test_a_budget_counts_executions_through_both_gateways(cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["beta"]
    async with gateway_client(one, key=key) as first, gateway_client(two, key=key) as second:
        sid = (await create_session(first))["id"]
        try:
            for client in (first, second, first):
                assert (await execute(client, sid, "1"))["status"] == "ok"
            over = await execute(second, sid, "open('over.txt', 'w')")
            assert over["status"] == "budget_exceeded", over
            assert "max_executions" in over["error"]["evalue"]
            budget = (await second.get(f"/v1/sessions/{sid}")).json()["budget"]
            assert budget["executions_left"] == 0
            assert (await execute(first, sid, "1"))["status"] == "budget_exceeded"
        finally:
            await first.delete(f"/v1/sessions/{sid}")


async def test_a_budget_holds_against_executions_sent_at_once_through_both_gateways(
        cluster: Cluster) -> None:
    """Each gateway's gate claims its execution in the database before it runs: of twice the
    budget sent at once, half through each gateway, exactly the budget runs."""
    one, two = cluster.gateways
    key = one.keys["beta"]
    async with gateway_client(one, key=key) as first, gateway_client(two, key=key) as second:
        sid = (await create_session(first))["id"]
        try:
            results = await asyncio.gather(*(
                execute(client, sid, "import time; time.sleep(0.05); 1")
                for client in (first, second) * BUDGET))
            statuses = sorted(result["status"] for result in results)
            assert statuses == ["budget_exceeded"] * BUDGET + ["ok"] * BUDGET, results
            budget = (await first.get(f"/v1/sessions/{sid}")).json()["budget"]
            assert budget["executions_left"] == 0
        finally:
            await first.delete(f"/v1/sessions/{sid}")


async def test_an_e2b_sandbox_ends_on_time_after_its_gateway_is_killed(
        cluster: Cluster) -> None:
    one, two = cluster.gateways
    key = one.keys["alpha"]
    through_two = {"api_url": f"{two.url}/e2b", "sandbox_url": f"{two.url}/e2b/sandbox",
                   "api_key": key}
    sandbox = await AsyncSandbox.create(timeout=5, api_url=f"{one.url}/e2b",
                                        sandbox_url=f"{one.url}/e2b/sandbox", api_key=key)
    made = datetime.now(UTC)
    try:
        one.stop(signal.SIGKILL)
        info = await AsyncSandbox.get_info(sandbox.sandbox_id, **through_two)
        assert abs((info.end_at - made).total_seconds() - 5) < 3, info.end_at
        async with gateway_client(two, key=key) as second:
            assert (await second.get(f"/v1/sessions/{sandbox.sandbox_id}")).status_code == 200
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                answer = await second.get(f"/v1/sessions/{sandbox.sandbox_id}")
                if answer.status_code == 404:
                    break
                await asyncio.sleep(0.5)
            assert answer.status_code == 404, "the sandbox outlived its timeout"
        ended = (datetime.now(UTC) - made).total_seconds()
        assert 4 < ended < 20, ended
        assert not [s for s in await AsyncSandbox.list(**through_two).next_items()
                    if s.sandbox_id == sandbox.sandbox_id]
    finally:
        one.start()  # back for the cluster's teardown


async def test_a_sandbox_said_gone_is_in_no_later_list_while_its_deletion_ends(
        cluster: Cluster) -> None:
    """A node forgets a session as its deletion starts, before that deletion returns; the
    gateway deleting it used to go on listing it from its own copy meanwhile (the test above
    saw ``Sandbox.list`` show a sandbox the gateway had just answered 404 for), and the other
    gateway's ``GET /v1/sessions`` answered 404 for the whole list, its copy's refresh failing."""
    one, two = cluster.gateways
    async with gateway_client(one) as client, gateway_client(two, key_of=one) as other:
        sid = (await create_session(client))["id"]
        assert (await other.get(f"/v1/sessions/{sid}")).status_code == 200  # a copy there
        deleting = asyncio.ensure_future(client.delete(f"/v1/sessions/{sid}"))
        said_gone = listed_after = 0
        other_lists: set[int] = set()
        deadline = time.monotonic() + 60
        while (not deleting.done() or said_gone < 5) and time.monotonic() < deadline:
            other_lists.add((await other.get("/v1/sessions")).status_code)
            if (await client.get(f"/v1/sessions/{sid}")).status_code == 404:
                said_gone += 1
                listed = await client.get("/e2b/sandboxes")
                assert listed.status_code == 200, listed.text
                listed_after += sid in {s["sandboxID"] for s in listed.json()}
        assert (await deleting).status_code == 204
        assert said_gone >= 5 and listed_after == 0, (said_gone, listed_after)
        assert other_lists == {200}
