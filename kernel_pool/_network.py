"""A session's network policy: what its sandbox may reach through its egress proxy.

``{"default": "deny" | "allow", "allow": [...], "deny": [...]}``. Entries are host names
(``api.example.com``), wildcards (``*.example.com``: any name below it), IP addresses and CIDR
networks, each with an optional ``:port``. An attempt matching an allow entry is allowed; else
one matching a deny entry is refused; else the default decides (E2B's ``allow_out`` wins over
its ``deny_out`` the same way). An allow entry without a port allows 80 and 443 (as a profile's
``egress_allow`` always did); a deny entry without a port denies every port.

The profile bounds it (:func:`profile_bound`): its ``network_max`` when the operator wrote one,
else its ``egress_allow`` (a session may then narrow the profile's hosts, never add one).
:func:`policy_beyond` names the first entry of a policy wider than its bound (the gateway's
403), and every attempt is decided by both (:class:`NetworkRules`), so an entry that only partly
overlaps its bound never opens more than the bound. Whatever either says, a session's
attempts never reach the guarded addresses: metadata services, loopback, link-local,
unspecified and multicast ranges, and this host's own addresses (its interfaces, read again
every few seconds), nor any network the pool's settings name (the cluster's own).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import ipaddress
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernel_pool._allowlist import (
    _GUARDED,
    _HOST_NAME,
    DEFAULT_PORTS,
    RESOLVE_TIMEOUT_S,
    IPAddress,
    normal_host,
    parse_port,
    split_host_port,
)
from kernel_pool._broker_rules import SecretRule, check_rules

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_ENTRIES = 256
OWN_ADDRESSES_TTL_S = 5.0
PROXY_ENV = {name: "http://127.0.0.1:3128"
             for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
"""What a sandbox with a policy gets in its environment (the launcher's forwarder's address);
``NO_PROXY`` keeps the sandbox's own loopback direct."""
PROXY_ENV |= {"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1"}


class NetworkPolicy(BaseModel):
    """A session's network policy (``"network"`` on create, ``/v1/sessions/{id}/network``)."""

    model_config = ConfigDict(extra="forbid")

    default: Literal["deny", "allow"] = Field(
        "deny", description="what an attempt no entry matches gets")
    allow: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES,
                             description="hosts, *.domains, IPs, CIDRs (optional :port; "
                             "without one: 80 and 443)")
    deny: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES,
                            description="the same forms (without a port: every port)")

    rules: list[SecretRule] = Field(
        default_factory=list, max_length=MAX_ENTRIES,
        description="secrets put into the HTTPS requests each rule matches (docs/secrets.md); "
        "only with default \"deny\"")

    @field_validator("allow", "deny")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_entry(text)
        return value

    @model_validator(mode="after")
    def _rules(self) -> NetworkPolicy:
        check_rules(self.default, self.rules)
        return self


@dataclass(frozen=True)
class Entry:
    """One parsed entry: a name (exact or ``*.suffix``) or a network, and its port."""

    text: str
    name: str | None
    network: IPNetwork | None
    port: int | None

    def ports(self, deny: bool) -> frozenset[int] | None:
        """The ports it covers; None: every port."""
        if self.port is not None:
            return frozenset((self.port,))
        return None if deny else frozenset(DEFAULT_PORTS)

    def matches(self, name: str | None, address: IPAddress | None, port: int,
                deny: bool) -> bool:
        ports = self.ports(deny)
        if ports is not None and port not in ports:
            return False
        if self.network is not None:
            return address is not None and address.version == self.network.version \
                and address in self.network
        if name is None or self.name is None:
            return False
        if self.name.startswith("*."):
            return name.endswith(self.name[1:]) and len(name) > len(self.name) - 1
        return name == self.name

    def within(self, other: Entry, deny: bool) -> bool:
        """Whether everything this entry covers, ``other`` covers too."""
        mine, theirs = self.ports(deny=False), other.ports(deny)
        if theirs is not None and (mine is None or not mine <= theirs):
            return False
        if self.network is not None or other.network is not None:
            return (self.network is not None and other.network is not None
                    and self.network.version == other.network.version
                    and self.network.subnet_of(other.network))  # type: ignore[arg-type]
        assert self.name is not None and other.name is not None
        if other.name.startswith("*."):
            suffix = other.name[1:]
            return self.name.endswith(suffix) and len(self.name) > len(suffix)
        return self.name == other.name


def parse_entry(raw: str) -> Entry:
    """One entry, or ValueError naming it and the accepted forms."""
    text = raw.strip().lower().rstrip(".")
    where = f"network entry {raw!r}"
    if "/" in text:  # 10.0.0.0/8, 10.0.0.0/8:443, 2001:db8::/32, [2001:db8::]/32:443
        address_text, _, rest = text.partition("/")
        prefix, colon, port_text = rest.partition(":")
        try:
            network = ipaddress.ip_network(f"{address_text.strip('[]')}/{prefix}",
                                           strict=False)
        except ValueError:
            raise ValueError(f"{where} is not a CIDR network (10.0.0.0/8, "
                             "2001:db8::/32, optionally :port)") from None
        return Entry(text=raw, name=None, network=network,
                     port=parse_port(port_text, where) if colon else None)
    try:
        host, given = split_host_port(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    port = None if given is None else parse_port(given, where)
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host)
        return Entry(text=raw, name=None, network=ipaddress.ip_network(address), port=port)
    bare = host[2:] if host.startswith("*.") else host
    if "*" in bare or not _HOST_NAME.fullmatch(bare):
        raise ValueError(f"{where} is not a host: use a name (api.example.com), a wildcard "
                         "(*.example.com), an IP address or a CIDR network, each with an "
                         "optional :port")
    return Entry(text=raw, name=host, network=None, port=port)


def profile_bound(egress_allow: Sequence[str], network_max: NetworkPolicy | None,
                  ) -> NetworkPolicy:
    """The widest policy a session of a profile may have: its ``network_max``, else its
    ``egress_allow`` hosts (default deny)."""
    if network_max is not None:
        return network_max
    return NetworkPolicy(default="deny", allow=list(egress_allow))


def policy_beyond(policy: NetworkPolicy, bound: NetworkPolicy) -> str | None:
    """Why ``policy`` opens more than ``bound`` (naming the entry), or None when it does not."""
    if policy.default == "allow" and bound.default == "deny":
        return ("'default': 'allow' is wider than this profile allows (its network is closed "
                "but for its own list)")
    bound_allow = [parse_entry(text) for text in bound.allow]
    bound_deny = [parse_entry(text) for text in bound.deny]
    for text in policy.allow:
        entry = parse_entry(text)
        if bound.default == "deny" and not any(entry.within(b, False) for b in bound_allow):
            return f"allow entry {text!r} is beyond what this profile allows"
        if bound.default == "allow" and any(entry.within(b, True) for b in bound_deny):
            return f"allow entry {text!r} is denied by this profile"
    return None


class _Decider:
    def __init__(self, policy: NetworkPolicy) -> None:
        self.default = policy.default
        self.allow = [parse_entry(text) for text in policy.allow]
        self.deny = [parse_entry(text) for text in policy.deny]

    def decide(self, name: str | None, address: IPAddress | None, port: int,
               ) -> tuple[bool, str]:
        for entry in self.allow:
            if entry.matches(name, address, port, deny=False):
                return True, f"allowed by {entry.text!r}"
        for entry in self.deny:
            if entry.matches(name, address, port, deny=True):
                return False, f"denied by {entry.text!r}"
        if self.default == "allow":
            return True, "allowed by the default"
        return False, "not on the allow list (the default is deny)"

    def refuses_name(self, name: str, port: int) -> str | None:
        """Why ``name`` is refused before any lookup (a deny entry names it, or nothing could
        allow it), or None."""
        allowed, reason = self.decide(name, None, port)
        if allowed:
            return None
        if reason.startswith("denied"):
            return reason
        if any(entry.network is not None for entry in self.allow):
            return None  # its address may be allowed
        return reason


class NetworkRules:
    """A session's policy within its profile's bound: decides (and resolves) each attempt."""

    def __init__(self, policy: NetworkPolicy, bound: NetworkPolicy,
                 guarded: Iterable[IPNetwork] = ()) -> None:
        self.policy = policy
        self._policy = _Decider(policy)
        self._bound = _Decider(bound)
        self._guarded = [*_GUARDED, *guarded]

    def __str__(self) -> str:
        return (f"default {self.policy.default}, allow {', '.join(self.policy.allow) or '-'}, "
                f"deny {', '.join(self.policy.deny) or '-'}")

    async def decide(self, host: str, port: int) -> tuple[str | None, str]:
        """``(address, why allowed)`` or ``(None, why refused)``."""
        name = normal_host(host)
        if not 1 <= port <= 65535:
            return None, f"port {port} is not valid"
        literal = _address(name)
        if literal is not None:
            return self._decide_address(None, literal, port)
        if not _HOST_NAME.fullmatch(name):
            return None, f"{host!r} is not a valid host name"
        with contextlib.suppress(OSError):
            socket.inet_aton(name)  # 0x7f.1, 2130706433: an IP address in disguise
            return None, f"{host!r} is an IP address in a non-standard form"
        refused = self._policy.refuses_name(name, port)
        if refused is not None:
            return None, f"port {port}: {refused}"
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    name, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            return None, f"cannot resolve {name}: {exc or 'timed out'}"
        refusal = f"cannot resolve {name}: no usable address"
        for info in infos:
            address = _address(str(info[4][0]))
            if address is None:
                continue
            chosen, reason = self._decide_address(name, address, port)
            if chosen is not None:
                return chosen, reason
            refusal = f"{name} ({address}): {reason}"
        return None, refusal

    def _decide_address(self, name: str | None, address: IPAddress,
                        port: int) -> tuple[str | None, str]:
        if any(address.version == net.version and address in net
               for net in (*self._guarded, *_cluster)) or address in own_addresses():
            return None, (f"{address} is guarded (metadata, loopback, link-local, multicast, "
                          "or this host's or cluster's own): no policy reaches it")
        allowed, reason = self._policy.decide(name, address, port)
        if not allowed:
            return None, f"port {port}: {reason}"
        within, why = self._bound.decide(name, address, port)
        if not within:
            return None, f"beyond the profile's bound ({why})"
        return str(address), reason


def _address(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


_own: tuple[float, frozenset[IPAddress]] = (0.0, frozenset())
_cluster: set[IPNetwork] = set()
"""The cluster's own addresses (:func:`guard`), guarded in every policy of this process."""


async def guard(entries: Iterable[str]) -> None:
    """Guard these addresses, networks and hosts (names resolved now) from every policy of
    this process; a name that does not resolve is skipped (logged by the caller's start)."""
    loop = asyncio.get_running_loop()
    for text in entries:
        entry = parse_entry(text)
        if entry.network is not None:
            _cluster.add(entry.network)
            continue
        assert entry.name is not None
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await loop.getaddrinfo(entry.name.removeprefix("*."), None)
            for info in infos:
                if (address := _address(str(info[4][0]))) is not None:
                    _cluster.add(ipaddress.ip_network(address))


def own_addresses() -> frozenset[IPAddress]:
    """This host's interface addresses (IPv4 and IPv6), read again every few seconds."""
    global _own
    now = time.monotonic()
    if now - _own[0] > OWN_ADDRESSES_TTL_S:
        _own = (now, frozenset(_read_own_addresses()))
    return _own[1]


def _read_own_addresses() -> Iterable[IPAddress]:
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as lines:
        for line in lines:
            yield ipaddress.IPv6Address(int(line.split()[0], 16))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        size = 128 * 40
        buffer = array.array("B", b"\0" * size)
        request = struct.pack("iL", size, buffer.buffer_info()[0])
        with contextlib.suppress(OSError):
            length = struct.unpack("iL", fcntl.ioctl(probe.fileno(), 0x8912, request))[0]
            raw = buffer.tobytes()[:length]
            for offset in range(0, length, 40):  # struct ifreq: 16 name, then sockaddr_in
                yield ipaddress.IPv4Address(raw[offset + 20:offset + 24])
