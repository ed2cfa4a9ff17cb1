"""E2B's network options on a session's network policy (:mod:`gateway.network`).

E2B's ``allow_internet_access`` and ``network.allow_out``/``deny_out`` (a create's, or
``PUT /sandboxes/{id}/network``'s, which replaces them all) become a policy: ``deny_out``
naming all traffic (``0.0.0.0/0``), or ``allow_internet_access: false``, closes the network
(``default: deny``) but for ``allow_out``; otherwise it is open (``default: allow``) but for
``deny_out``, and ``allow_out`` wins over ``deny_out`` as on E2B. An entry without a port opens
80 and 443 (replgate's proxy carries HTTP and HTTPS). A policy wider than the profile allows
is E2B's 403 with the sentence naming the entry, except E2B's default ask (the internet, said
or unsaid), which a profile that does not open the network answers with its own network, as
the sandbox's description then says (``allowInternetAccess: false``, its ``allowOut``).
``maskRequestHost`` and ``egressProxy`` cannot map and are refused with a sentence.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status
from pydantic import Field

from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError, E2BRoute, unsupported
from gateway.e2b._models import Lenient, SandboxNetwork
from gateway.e2b._tenant import TenantDep
from gateway.network import change_network, check_network
from kernel_pool import NetworkPolicy, Profile, SessionPort, policy_beyond, profile_bound

ALL_TRAFFIC = ("0.0.0.0/0", "::/0")
"""E2B's ``all_traffic`` selector (and its IPv6 twin)."""

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)


class NetworkUpdate(Lenient):
    """``SandboxNetworkUpdateConfig``: the sandbox's egress, replaced as a whole."""

    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    allow_internet_access: bool | None = Field(None, alias="allowInternetAccess")
    egress_proxy: Any = Field(None, alias="egressProxy")
    rules: dict[str, Any] | None = None


def refuse_unmappable(asked: dict[str, Any]) -> None:
    """E2B's network options that have no counterpart here: a 400 naming them."""
    unmapped = sorted(key for key, value in asked.items()
                      if key not in ("allowOut", "denyOut", "allow_out", "deny_out")
                      and value not in (None, [], {}, ""))
    if unmapped:
        raise unsupported(
            f"network options {', '.join(unmapped)}",
            "replgate maps allow_out, deny_out and allow_internet_access onto the session's "
            "network policy (its egress proxy); header rules are set with replgate's own "
            "network rules")


def policy_for(profile: Profile, allow_out: list[str] | None, deny_out: list[str] | None,
               internet: bool | None) -> NetworkPolicy | None:
    """The policy E2B's options ask for on ``profile``; None: the profile's own network (E2B's
    default ask, where the profile does not let a session open the network)."""
    deny = [entry for entry in deny_out or [] if entry.strip() not in ALL_TRAFFIC]
    closed = internet is False or len(deny) != len(deny_out or [])
    try:
        policy = NetworkPolicy(default="deny" if closed else "allow",
                               allow=list(allow_out or []), deny=deny)
    except ValueError as exc:
        raise E2BError(400, f"invalid network options: {exc}") from None
    if not closed and not policy.allow and not policy.deny and policy_beyond(
            policy, profile_bound(profile.egress_allow, profile.network_max)) is not None:
        return None
    check_network(profile, policy)
    return policy


def described(session: SessionPort) -> tuple[bool, SandboxNetwork]:
    """(``allowInternetAccess``, ``network``) of a sandbox, as E2B's answers say them."""
    policy = session.network
    if policy is None:
        return False, SandboxNetwork(allowOut=list(session.profile.egress_allow))
    closed = ["0.0.0.0/0"] if policy.default == "deny" else []
    return policy.default == "allow", SandboxNetwork(allowOut=list(policy.allow),
                                                     denyOut=[*closed, *policy.deny])


@router.put("/sandboxes/{sandbox_id}/network", status_code=status.HTTP_204_NO_CONTENT)
async def update_network(sandbox_id: str, body: NetworkUpdate, tenant: TenantDep,
                         gateway: GatewayDep) -> Response:
    """Replace the sandbox's egress (``Sandbox.update_network``): the next connections are
    decided by it."""
    refuse_unmappable({"egressProxy": body.egress_proxy, "rules": body.rules})
    session = await gateway.session(tenant, sandbox_id)
    policy = policy_for(session.profile, body.allow_out, body.deny_out,
                        body.allow_internet_access)
    await change_network(gateway.store, session, policy)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
