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

E2B's header ``rules`` (``{host: [{"transform": {"headers": {...}}}]}``) become the policy's
secret rules (:class:`kernel_pool.SecretRule`, docs/secrets.md): each host's headers are set on
every HTTPS request to it on port 443, and a ``${e2b.secrets.NAME}`` placeholder in a value
(E2B's ``Secret.fill``) is the tenant's secret of that (lower-cased) name, put in at the egress
only. As on replgate's own API, rules need a closed network (``deny_out`` naming all traffic,
or ``allow_internet_access: false``) and do not open their hosts (``allow_out`` does). What
has no counterpart is refused with a sentence: CIDR keys, and workload identity tokens
(``${e2b.identity.tokens.NAME}``). Where several keys match a host, replgate applies every
matching set, the most specific last (E2B applies only the most specific).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Response, status
from pydantic import Field, ValidationError

from gateway.deps import GatewayDep
from gateway.e2b._errors import E2BError, E2BRoute, unsupported
from gateway.e2b._models import Lenient, SandboxNetwork
from gateway.e2b._tenant import TenantDep
from gateway.network import change_network, check_network
from kernel_pool import NetworkPolicy, Profile, SessionPort, policy_beyond, profile_bound

ALL_TRAFFIC = ("0.0.0.0/0", "::/0")
"""E2B's ``all_traffic`` selector (and its IPv6 twin)."""
E2B_SECRET = re.compile(r"\$\{e2b\.secrets\.([^{}]*)\}")
"""``Secret.fill(NAME)``: the placeholder E2B's egress turns into the secret's value."""
E2B_PLACEHOLDER = re.compile(r"\$\{e2b\.([^{}]*)\}")
SECRET_NAME = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
OUR_SECRET = re.compile(r"\{secret:([^{}]*)\}")

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
                      if key not in ("allowOut", "denyOut", "allow_out", "deny_out", "rules")
                      and value not in (None, [], {}, ""))
    if unmapped:
        raise unsupported(
            f"network options {', '.join(unmapped)}",
            "replgate maps allow_out, deny_out, allow_internet_access and header rules onto "
            "the session's network policy (its egress proxy)")


def _header_value(host: str, name: str, value: Any) -> str:
    """A rule's header value with E2B's secret placeholders as replgate's."""
    if not isinstance(value, str):
        raise E2BError(400, f"network rule for {host!r}: header {name!r} must be a string")
    for found in E2B_PLACEHOLDER.findall(value):
        if not found.startswith("secrets."):
            raise unsupported(
                f"the placeholder ${{e2b.{found}}} (network rule for {host!r}, header "
                f"{name!r})", "workload identity tokens are not available; store the "
                "credential as a secret and use Secret.fill(name)")
    for found in E2B_SECRET.findall(value):
        if not SECRET_NAME.fullmatch(found.lower()):
            raise E2BError(400, f"network rule for {host!r}, header {name!r}: {found[:80]!r} "
                                "is not a secret's name (letters, digits, '_' and '-', at "
                                "most 64)")
    return E2B_SECRET.sub(lambda m: f"{{secret:{m.group(1).lower()}}}", value)


def rules_for(asked: Any) -> list[dict[str, Any]]:
    """E2B's ``rules`` as secret rules (``NetworkPolicy.rules``' fields, checked there): the
    wildcard keys first (the shorter suffix first), exact hosts last, so that the most
    specific key's header wins as on E2B."""
    if not asked:
        return []
    if not isinstance(asked, dict):
        raise E2BError(400, "network rules must map hosts to lists of rules")
    made: list[tuple[tuple[int, int], dict[str, Any]]] = []
    for host, host_rules in asked.items():
        if "/" in host:
            raise unsupported(f"a network rule keyed by a CIDR range ({host!r})",
                              "key rules by a host name, a *.domain or an IP address")
        if not isinstance(host_rules, list):
            raise E2BError(400, f"network rules for {host!r} must be a list")
        headers: dict[str, str] = {}
        for rule in host_rules:
            transform = (rule or {}).get("transform") if isinstance(rule, dict) else None
            given = (transform or {}).get("headers") if isinstance(transform, dict) else None
            for name, value in (given or {}).items():
                headers[name] = _header_value(host, name, value)
        if not headers:
            continue
        wildcard = host.startswith("*.")
        made.append(((0 if wildcard else 1, len(host)),
                     {"host": host, "port": 443, "headers": headers}))
    return [rule for _, rule in sorted(made, key=lambda pair: pair[0])]


def rules_described(policy: NetworkPolicy) -> dict[str, list[dict[str, Any]]]:
    """A policy's secret rules in E2B's shape (placeholders, never a value; a rule's methods,
    paths and ports, which E2B's shape has no room for, are not said)."""
    described: dict[str, list[dict[str, Any]]] = {}
    for rule in policy.rules:
        headers = {name: OUR_SECRET.sub(lambda m: f"${{e2b.secrets.{m.group(1)}}}", value)
                   for name, value in rule.headers.items()}
        described.setdefault(rule.host, []).append({"transform": {"headers": headers}})
    return described


def policy_for(profile: Profile, allow_out: list[str] | None, deny_out: list[str] | None,
               internet: bool | None, rules: Any = None) -> NetworkPolicy | None:
    """The policy E2B's options ask for on ``profile``; None: the profile's own network (E2B's
    default ask, where the profile does not let a session open the network)."""
    deny = [entry for entry in deny_out or [] if entry.strip() not in ALL_TRAFFIC]
    closed = internet is False or len(deny) != len(deny_out or [])
    secret_rules = rules_for(rules)
    if secret_rules and not closed:
        raise E2BError(400, "network rules need a closed network, so that no header reaches "
                            "a host you did not list: add deny_out=[ALL_TRAFFIC] (or "
                            "allow_internet_access=False) and name the rules' hosts in "
                            "allow_out")
    try:
        policy = NetworkPolicy.model_validate({
            "default": "deny" if closed else "allow", "allow": list(allow_out or []),
            "deny": deny, "rules": secret_rules})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
                             for error in exc.errors())
        raise E2BError(400, f"invalid network options: {problems}") from None
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
                                                     denyOut=[*closed, *policy.deny],
                                                     rules=rules_described(policy))


@router.put("/sandboxes/{sandbox_id}/network", status_code=status.HTTP_204_NO_CONTENT)
async def update_network(sandbox_id: str, body: NetworkUpdate, tenant: TenantDep,
                         gateway: GatewayDep) -> Response:
    """Replace the sandbox's egress (``Sandbox.update_network``): the next connections are
    decided by it."""
    refuse_unmappable({"egressProxy": body.egress_proxy})
    session = await gateway.session(tenant, sandbox_id)
    policy = policy_for(session.profile, body.allow_out, body.deny_out,
                        body.allow_internet_access, body.rules)
    await change_network(gateway.store, session, policy)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
