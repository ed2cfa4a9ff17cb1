"""The network policy's decisions and its bound (no sandbox: names, addresses and ports)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernel_pool import Profile
from kernel_pool._network import (
    NetworkPolicy,
    NetworkRules,
    guard,
    parse_entry,
    policy_beyond,
    profile_bound,
)


@pytest.mark.parametrize("entry", ["*", "a*b.example", "host:0", "10.0.0.0/33", "[::1",
                                   "two words", "10.0.0.0/8:http"])
def test_a_bad_entry_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(ValidationError, match="network entry"):
        NetworkPolicy(allow=[entry])


def test_entries_parse_names_wildcards_addresses_and_networks() -> None:
    assert parse_entry("API.example.com.").name == "api.example.com"
    assert parse_entry("*.example.com:8443").port == 8443
    assert str(parse_entry("10.1.2.3").network) == "10.1.2.3/32"
    assert str(parse_entry("[2001:db8::]/32:443").network) == "2001:db8::/32"


def test_a_policy_beyond_its_bound_names_the_entry() -> None:
    bound = NetworkPolicy(allow=["*.example.com", "10.0.0.0/8:443"])
    assert policy_beyond(NetworkPolicy(allow=["api.example.com", "10.1.0.0/16:443"]), bound) is None
    assert "'pypi.org'" in (policy_beyond(NetworkPolicy(allow=["pypi.org"]), bound) or "")
    assert "'10.1.0.0/16'" in (policy_beyond(NetworkPolicy(allow=["10.1.0.0/16"]), bound) or "")
    assert "default" in (policy_beyond(NetworkPolicy(default="allow"), bound) or "")
    open_bound = NetworkPolicy(default="allow", deny=["*.internal"])
    assert policy_beyond(NetworkPolicy(default="allow"), open_bound) is None
    assert "denied by this profile" in (
        policy_beyond(NetworkPolicy(allow=["db.internal"]), open_bound) or "")


def test_a_profile_without_network_max_is_bound_by_its_egress_allow() -> None:
    profile = Profile(name="p", egress_allow=["pypi.org:443"])
    bound = profile_bound(profile.egress_allow, profile.network_max)
    assert bound == NetworkPolicy(allow=["pypi.org:443"])
    assert policy_beyond(NetworkPolicy(allow=["pypi.org:443"]), bound) is None
    assert policy_beyond(NetworkPolicy(allow=["pypi.org"]), bound) is not None  # 80 too: wider


async def test_allow_wins_over_deny_and_the_default_decides_the_rest() -> None:
    rules = NetworkRules(NetworkPolicy(default="allow", allow=["10.9.9.9"],
                                       deny=["10.0.0.0/8", "*.blocked.test"]),
                         NetworkPolicy(default="allow"))
    assert (await rules.decide("10.9.9.9", 443))[0] == "10.9.9.9"
    assert "denied by '10.0.0.0/8'" in (await rules.decide("10.1.1.1", 80))[1]
    assert "denied by '*.blocked.test'" in (await rules.decide("a.blocked.test", 443))[1]
    assert (await rules.decide("192.0.2.77", 8080))[0] == "192.0.2.77"
    assert "non-standard form" in (await rules.decide("2130706433", 80))[1]


async def test_the_bound_is_applied_to_every_attempt() -> None:
    rules = NetworkRules(NetworkPolicy(default="allow"), NetworkPolicy(allow=["192.0.2.0/24"]))
    assert (await rules.decide("192.0.2.5", 443))[0] == "192.0.2.5"
    assert "beyond the profile's bound" in (await rules.decide("198.51.100.1", 443))[1]


@pytest.mark.parametrize("target", ["169.254.169.254", "127.0.0.1", "0.0.0.0", "::1",
                                    "fe80::1", "224.0.0.1", "100.100.100.200"])
async def test_guarded_addresses_are_refused_even_when_listed(target: str) -> None:
    rules = NetworkRules(NetworkPolicy(default="allow", allow=[f"[{target}]:80"]),
                         NetworkPolicy(default="allow"))
    address, reason = await rules.decide(target, 80)
    assert address is None and "guarded" in reason


async def test_the_clusters_own_addresses_are_guarded_once_named() -> None:
    rules = NetworkRules(NetworkPolicy(default="allow"), NetworkPolicy(default="allow"))
    assert (await rules.decide("198.18.7.7", 443))[0] == "198.18.7.7"
    await guard(["198.18.7.0/24"])
    address, reason = await rules.decide("198.18.7.7", 443)
    assert address is None and "guarded" in reason
    assert (await rules.decide("198.18.8.1", 443))[0] == "198.18.8.1"

