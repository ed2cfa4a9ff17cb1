"""An allowlist profile's egress rules: which host and port an attempt may reach, and at which
address (the proxy resolves names itself, and refuses names that resolve to guarded addresses:
link-local, metadata, loopback, unspecified, multicast). :mod:`kernel_pool._egress` serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_PORTS = (80, 443)
RESOLVE_TIMEOUT_S = 5.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Refused as the target of a *name*, unless the address itself is on the list.
_GUARDED = [ipaddress.ip_network(net) for net in (
    "169.254.0.0/16", "fe80::/10",            # link-local, incl. 169.254.169.254 metadata
    "100.100.100.200/32", "fd00:ec2::254/128",  # other clouds' metadata services
    "127.0.0.0/8", "::1/128",                 # the gateway host itself
    "0.0.0.0/8", "::/128",                    # unspecified
    "224.0.0.0/4", "ff00::/8",                # multicast
)]
_HOST_NAME = re.compile(r"(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*"
                        r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


@dataclass(frozen=True)
class AllowEntry:
    """One ``egress_allow`` entry: a host (exact, ``*.suffix`` or IP) and an optional port."""

    text: str
    host: str
    port: int | None
    address: IPAddress | None

    def ports(self) -> tuple[int, ...]:
        return DEFAULT_PORTS if self.port is None else (self.port,)

    def matches_name(self, name: str) -> bool:
        if self.address is not None:
            return False
        if self.host.startswith("*."):
            return name.endswith(self.host[1:]) and len(name) > len(self.host) - 1
        return name == self.host



def normal_host(host: str) -> str:
    """A host as rules compare it: lower case, no trailing dot, no IPv6 literal's brackets."""
    name = host.strip().lower().rstrip(".")
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def _ip(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address



def split_host_port(text: str) -> tuple[str, str | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: write an IPv6 address as [address] or [address]:port")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:
        return text, None
    host, colon, port = text.partition(":")
    return host, port if colon else None



def parse_port(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{where}: port {text!r} is not a number from 1 to 65535")
    return int(text)



def parse_allow(entries: Iterable[str]) -> list[AllowEntry]:
    """Validate ``egress_allow`` entries; ValueError names the entry and the accepted forms."""
    parsed = []
    for raw in entries:
        text = raw.strip().lower().rstrip(".")
        where = f"egress_allow entry {raw!r}"
        try:
            host, port_text = split_host_port(text)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        port = None if port_text is None else parse_port(port_text, where)
        address = _ip(host)
        bare = host[2:] if host.startswith("*.") else host
        if address is None and ("*" in bare or not _HOST_NAME.fullmatch(bare)):
            raise ValueError(
                f"{where} is not a host: use a name (pypi.internal), a wildcard "
                "(*.example.com) or an IP address, each with an optional :port")
        parsed.append(AllowEntry(text=raw, host=host, port=port, address=address))
    return parsed



class EgressRules:
    """The allowlist of one profile: decides, and resolves names, for each attempt."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.entries = parse_allow(entries)
        self._listed = {entry.address for entry in self.entries if entry.address is not None}

    def __str__(self) -> str:
        return ", ".join(entry.text for entry in self.entries)

    async def decide(self, host: str, port: int) -> tuple[str | None, str]:
        """``(address, why allowed)`` or ``(None, why refused)``."""
        name = normal_host(host)
        if not 1 <= port <= 65535:
            return None, f"port {port} is not valid"
        address = _ip(name)
        if address is not None:
            for entry in self.entries:
                if entry.address == address and port in entry.ports():
                    return str(address), f"allowed by {entry.text!r}"
            listed = address in self._listed
            return None, (f"port {port} is not allowed for {address}" if listed else
                          f"raw IP address {address} is not on the egress allowlist")
        if not _HOST_NAME.fullmatch(name):
            return None, f"{host!r} is not a valid host name"
        with contextlib.suppress(OSError):
            socket.inet_aton(name)  # 0x7f.1, 2130706433: an IP address in disguise
            return None, f"{host!r} is an IP address in a non-standard form"
        named = [entry for entry in self.entries if entry.matches_name(name)]
        if not named:
            return None, f"host {name} is not on the egress allowlist"
        chosen = next((e for e in named if port in e.ports()), None)
        if chosen is None:
            ports = sorted({p for e in named for p in e.ports()})
            return None, (f"port {port} is not allowed for {name} "
                          f"(allowed: {', '.join(map(str, ports))})")
        return await self._resolve(name, port, chosen)

    async def _resolve(self, name: str, port: int, entry: AllowEntry) -> tuple[str | None, str]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            return None, f"cannot resolve {name}: {exc or 'timed out'}"
        guarded = []
        for info in infos:
            address = _ip(str(info[4][0]))
            if address is None:
                continue
            if address in self._listed or not any(address in net for net in _GUARDED):
                return str(address), f"allowed by {entry.text!r}"
            guarded.append(str(address))
        if guarded:
            return None, (f"{name} resolves to {', '.join(guarded)} (link-local, metadata, "
                          "loopback or multicast), refused unless that address is listed")
        return None, f"cannot resolve {name}: no usable address"
