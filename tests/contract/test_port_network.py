"""A session's network policy through the port: applied where the sandbox runs (this process,
or the node, whose proxy then decides), kept in the session's state, inherited by a fork."""

from __future__ import annotations

import pytest

from kernel_pool import InvalidRequest, NetworkPolicy, SessionHost, SessionPort

FETCH = """
import requests
try:
    print(requests.get('http://198.51.100.7/', timeout=10).text.strip())
except Exception as exc:
    print('failed', type(exc).__name__)
"""


async def test_a_policy_is_applied_by_the_proxy_where_the_sandbox_runs(
        host: SessionHost, session: SessionPort) -> None:
    assert session.network is None and session.state().network is None
    closed = NetworkPolicy(default="deny", deny=["198.51.100.0/24"])
    await session.set_network(closed)
    assert session.network == closed and session.state().network == closed
    out = (await session.submit(FETCH).result()).stdout
    assert out.startswith("replgate egress refused 198.51.100.7:80"), out  # the proxy's word
    attempts = await session.egress_attempts()
    assert attempts[-1].host == "198.51.100.7" and not attempts[-1].allowed
    assert "denied by '198.51.100.0/24'" in attempts[-1].reason
    [child] = await host.fork_session(session.id, 1)
    try:
        assert child.network == closed
    finally:
        await host.delete_session(child.id)
    await session.set_network(None)
    assert session.network is None


async def test_secret_rules_are_refused_where_the_host_has_no_secrets(
        session: SessionPort) -> None:
    """Without the gateway's secrets (REPLGATE_SECRETS_KEY), a rule's secret could never be
    had: refused at once, in this process and for a session on a node (whose node would ask
    this gateway for it), and the session keeps the policy it had."""
    ruled = NetworkPolicy.model_validate({
        "default": "deny", "allow": ["api.example.com"],
        "rules": [{"host": "api.example.com", "headers": {"X-Key": "{secret:KEY}"}}]})
    with pytest.raises(InvalidRequest, match=r"secret rules need the gateway's secrets "
                                             r"\(REPLGATE_SECRETS_KEY\)"):
        await session.set_network(ruled)
    assert session.network is None
