"""Budgets' claims, on a real SQLite file and (REPLGATE_TEST_DATABASE=postgresql) a real
PostgreSQL: an execution is counted at the gate, never past the budget, and given back if it
then does not run. The session is a stand-in holding what the tracker reads (id, profile, age);
the end-to-end budget tests are in test_governance.py and tests/node/test_cluster_governance.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from common.policy import Budgets
from gateway.governance.budgets import BudgetTracker
from gateway.store import Store
from kernel_pool import DoneEvent, ExecutionHandle, ExecutionStatus, SessionPort


@pytest.fixture
async def store(database_target: str | Path) -> AsyncIterator[Store]:
    async with Store.open(database_target) as opened:
        yield opened


def _session(session_id: str = "s1") -> SessionPort:
    return cast(SessionPort, SimpleNamespace(id=session_id, profile=SimpleNamespace(cpus=1.0),
                                             created_at=datetime.now(UTC).isoformat()))


async def _settled(tracker: BudgetTracker) -> None:
    """Wait for the tracker's saves in the background."""
    while tracker._tasks:
        await asyncio.gather(*tracker._tasks)


async def test_claim_stops_at_the_budget_and_changes_nothing_then(store: Store) -> None:
    assert await store.claim_execution("s1", 0, 0.0, 0.0, max_executions=2, max_wall_s=None,
                                       max_cpu_s=None) == (1, 0.0, 0.0)
    assert await store.claim_execution("s1", 0, 1.5, 0.5, max_executions=2, max_wall_s=None,
                                       max_cpu_s=None) == (2, 1.5, 0.5)
    assert await store.claim_execution("s1", 0, 1.0, 0.0, max_executions=2, max_wall_s=None,
                                       max_cpu_s=None) is None
    assert await store.session_usage("s1") == (2, 1.5, 0.5)


async def test_claim_stops_at_a_time_budget(store: Store) -> None:
    await store.add_session_usage("s1", 1, 2.0, 0.25)
    assert await store.claim_execution("s1", 0, 0.0, 0.0, max_executions=None, max_wall_s=2.0,
                                       max_cpu_s=None) is None
    assert await store.claim_execution("s1", 0, 0.0, 0.0, max_executions=None, max_wall_s=None,
                                       max_cpu_s=0.25) is None
    assert await store.claim_execution("s1", 0, 0.0, 0.0, max_executions=None, max_wall_s=2.5,
                                       max_cpu_s=0.5) == (2, 2.0, 0.25)


async def test_claims_at_once_pass_no_more_than_the_budget(store: Store) -> None:
    """On a shared database, two gateways' trackers of one session; on SQLite (one gateway's
    alone), one tracker."""
    session = _session()
    limits = Budgets(max_executions=3)
    trackers = [BudgetTracker(limits, session, store)
                for _ in range(2 if store.database.shared else 1)]
    claims = await asyncio.gather(*(trackers[n % len(trackers)].claim() for n in range(10)))
    assert claims.count(None) == 3
    assert {claim[0] for claim in claims if claim is not None} == {"max_executions"}
    for tracker in trackers:
        await tracker.refresh()
        assert tracker.executions == 3
    assert (await store.session_usage(session.id))[0] == 3


async def test_an_execution_that_did_not_run_is_given_back(store: Store) -> None:
    session = _session()
    tracker = BudgetTracker(Budgets(max_executions=2), session, store)
    ran, not_run = (ExecutionHandle(name, "1", 10.0) for name in ("ran", "not-run"))
    for handle in (ran, not_run):
        assert await tracker.claim() is None
        tracker.ours.add(handle.id)
    assert tracker.remaining().executions_left == 0
    ran.ran = True  # its session started it (in this process: a run in the kernel)
    tracker.listener(session, ran, DoneEvent(status=ExecutionStatus.OK, execution_count=1,
                                             duration_ms=1500.0))
    tracker.listener(session, not_run, DoneEvent(status=ExecutionStatus.DIED,
                                                 execution_count=None, duration_ms=0.0))
    await _settled(tracker)
    assert tracker.remaining().executions_left == 1
    assert await store.session_usage(session.id) == (1, 1.5, 1.5)  # CPU: wall x 1 CPU
    assert await tracker.claim() is None
    exceeded = await tracker.claim()
    assert exceeded is not None and exceeded[0] == "max_executions"
