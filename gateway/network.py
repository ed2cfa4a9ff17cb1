"""A session's network policy (``"network"`` on create, ``/v1/sessions/{id}/network``).

The policy is checked against the profile's bound here (a policy wider than the operator lets
a session open is a 403 naming the entry), applied to the session's proxy wherever it runs (in
this process, or on its node over the node channel), and kept in its record, so that a fork
(its copies inherit it, in the pool), a gateway restart (:func:`reapply`, from the record)
and a node's recovery apply it again. Attaching it to a warm kernel at its claim costs one
socket and, when the kernel has no proxy variables yet, one silent request to it: a session
with a policy starts from the warm pool and from templates like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.errors import Forbidden
from common.store import Store
from kernel_pool import (
    NetworkPolicy,
    Profile,
    SessionHost,
    SessionPort,
    policy_beyond,
    profile_bound,
)

logger = logging.getLogger(__name__)


def check_network(profile: Profile, policy: NetworkPolicy) -> None:
    """Forbidden (403, naming the entry) when ``policy`` opens more than ``profile`` allows."""
    refusal = policy_beyond(policy, profile_bound(profile.egress_allow, profile.network_max))
    if refusal is not None:
        raise Forbidden(f"network policy refused for profile {profile.name!r}: {refusal}; "
                        "ask the operator to widen the profile's network_max")


def network_of(session: SessionPort) -> NetworkPolicy:
    """The policy a session runs under: its own, else its profile's (``egress_allow``)."""
    if session.network is not None:
        return session.network
    return NetworkPolicy(default="deny", allow=list(session.profile.egress_allow))


async def attach(host: SessionHost, session: SessionPort, policy: NetworkPolicy | None) -> None:
    """Apply a new session's policy at its claim; on failure the session is deleted."""
    if policy is None:
        return
    try:
        await session.set_network(policy)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(host.delete_session(session.id))
        raise


async def change_network(store: Store, session: SessionPort,
                         policy: NetworkPolicy | None) -> None:
    """Check, apply (to the next connections) and keep a live session's new policy (None:
    its profile's network again)."""
    if policy is not None:
        check_network(session.profile, policy)
    await session.set_network(policy)
    await store.update_session(session.id, network=policy)


async def reapply(session: SessionPort, policy: NetworkPolicy | None) -> None:
    """Apply a kept policy to a session taken back (a gateway restart, a node's recovery)."""
    if policy is None:
        return
    try:
        await session.set_network(policy)
    except Exception as exc:  # the session has its profile's network meanwhile: no wider
        logger.error("session %s: could not apply its network policy again: %s",
                     session.id, exc)
