"""The gateway's store: sessions (:mod:`common.store`), execution history, hashed API keys, and
the state governance and E2B share between gateways (approvals, budgets' use, sandboxes' ends),
in the gateway's database, one module of :mod:`gateway.records` per aggregate.

Every method is a single statement on an autocommitting connection (see :mod:`common.store`).
The audit log (:mod:`gateway.audit`) keeps its own tables in the same database, through
:attr:`Store.database`.

    async with Store.open(state_dir / "replgate.db") as store:
        await store.create_session(SessionRecord(id=..., tenant=..., profile="default"))
"""

from __future__ import annotations

from gateway.records.approvals import ApprovalRecords
from gateway.records.e2b_templates import E2BTemplateRecords
from gateway.records.executions import ExecutionRecords
from gateway.records.keys import KeyRecords
from gateway.records.sandbox_ends import SandboxEndRecords
from gateway.records.sandbox_lifecycles import SandboxLifecycleRecords
from gateway.records.secrets import SecretRecords
from gateway.records.snapshots import SnapshotRecords
from gateway.records.templates import TemplateRecords
from gateway.records.usage import UsageRecords

__all__ = ["Store"]


class Store(ExecutionRecords, KeyRecords, ApprovalRecords, UsageRecords, SandboxEndRecords,
            SandboxLifecycleRecords, SnapshotRecords, SecretRecords, TemplateRecords,
            E2BTemplateRecords):
    """Sessions, history, keys, approvals, budgets' use, sandboxes' ends and lifecycles,
    saved snapshots, tenants' sealed secrets and custom templates (with E2B's builds and
    tags of them). Make one with
    :meth:`open`."""
