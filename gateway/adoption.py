"""What a killed gateway left on its machine, taken back by the next one at its start.

One machine only: a gateway of nodes leaves nothing (its sessions run on, on their nodes).
"""

from __future__ import annotations

import logging

from common.store import SessionRecord
from gateway.network import reapply
from gateway.service import Gateway
from kernel_pool import KernelPool, SandboxInfo

logger = logging.getLogger(__name__)


async def take_back(gateway: Gateway, pool: KernelPool, kept: list[SandboxInfo],
                    records: dict[str, SessionRecord]) -> None:
    """Take back the sessions a previous gateway left running or paused in its own ``pool``;
    forget those that are gone, and remove every other sandbox it left on the host."""
    image = gateway.settings.limits.image
    digest = await pool.image_digest(image)
    if digest:
        gateway.recorder.image = f"{image}@{digest}"
    for info in kept:
        record = records[info.container_id]
        if pool.snapshots.info(record.id) is not None:
            continue  # paused, its container not removed yet: taken back as paused below
        try:
            session = await pool.adopt_session(
                info, session_id=record.id, env=record.env, metadata=record.metadata,
                created_at=record.created_at, execution_count=record.execution_count,
                tenant=record.tenant)
        except Exception as exc:
            logger.error("could not take back session %s: %s", record.id, exc)
            await pool.remove_sandbox(info)
            continue
        gateway.took_back(session.id, record.tenant)
        await reapply(session, record.network)
        logger.info("took back session %s of tenant %s", session.id, record.tenant)
    live = set(pool.sessions)
    for record in records.values():
        if record.id in live or record.sandbox is None:
            continue
        # A paused session (its container, if still there, runs no kernel: the next start of
        # the session reuses or removes it).
        if pool.snapshots.info(record.id) is not None:  # paused: resumed when used
            try:
                paused = await pool.adopt_paused_session(
                    record.sandbox, session_id=record.id, env=record.env,
                    metadata=record.metadata, created_at=record.created_at,
                    execution_count=record.execution_count, tenant=record.tenant)
                gateway.took_back(record.id, record.tenant)
                await reapply(paused, record.network)  # kept for its resume
                continue
            except Exception as exc:
                logger.error("could not take back paused session %s: %s", record.id, exc)
        await gateway.store.mark_deleted(record.id)
    await pool.remove_leftovers()  # of sandboxes no session above took back
