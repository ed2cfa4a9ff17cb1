"""A kernel's network: the egress proxy of its sandbox, deciding by the session's network
policy (or the profile's ``egress_allow``) and brokering the policy's secret rules."""

from __future__ import annotations

from pathlib import Path

from kernel_pool._allowlist import EgressRules
from kernel_pool._broker import SecretSource, no_secrets
from kernel_pool._broker_rules import SecretRule
from kernel_pool._channels import KernelChannels, KernelState
from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._egress import SOCKET_NAME, EgressProxy
from kernel_pool._network import PROXY_ENV, NetworkPolicy, NetworkRules, profile_bound
from kernel_pool._sandbox_ca import TRUST_ENV
from kernel_pool.backends.base import Sandbox
from kernel_pool.config import Profile
from kernel_pool.exceptions import InvalidRequest


class KernelNetwork(KernelChannels):
    """The network side of :class:`~kernel_pool._kernel.Kernel`."""

    sandbox: Sandbox
    profile: Profile

    def _init_network(self) -> None:
        self.egress: EgressProxy | None = None
        """The sandbox's egress proxy, for a profile with ``egress_allow`` or a session with a
        network policy."""
        self.network: NetworkPolicy | None = None
        """The session's network policy (None: the profile's ``egress_allow``), applied by
        :meth:`set_network` and at every start."""
        self.egress_ca_file: Path | None = None
        """Certificates the egress broker trusts besides the system's (the pool's setting)."""
        self.secret_source: SecretSource | None = None
        """A session's secrets, for the broker of a policy's ``rules`` (the pool's)."""

    async def _ensure_egress(self) -> None:
        """Serve the egress proxy (of the session's policy, else of the profile's
        ``egress_allow``) before the kernel, whose launcher looks for it."""
        if self.network is None and not self.profile.egress_allow:
            if self.egress is not None:
                egress, self.egress = self.egress, None
                await egress.close()
            return
        if self.egress is None:
            self.egress = EgressProxy(Path(self.sandbox.info.socket_dir) / SOCKET_NAME,
                                      self._egress_rules(), self.id, owner_uid=SANDBOX_UID,
                                      owner_gid=SANDBOX_GID)
        else:
            self.egress.rules = self._egress_rules()
        await self.egress.ensure()

    def _egress_rules(self) -> EgressRules | NetworkRules:
        if self.network is None:
            return EgressRules(self.profile.egress_allow)
        return NetworkRules(self.network, profile_bound(self.profile.egress_allow,
                                                        self.profile.network_max))

    async def set_network(self, policy: NetworkPolicy | None, session_id: str | None, *,
                          tenant: str = "") -> None:
        """Apply a network policy: the next connection is decided by it. A running kernel's
        proxy is served (or stopped) at once; a stopped one's at its next start. The kernel's
        environment gets the proxy's variables when it has a proxy (its launcher set them
        only if the proxy was there when it started). The policy's secret ``rules`` are
        brokered with ``tenant``'s secrets, as the session's source gives them (on a node: asked
        of a gateway, for this session, at each request; docs/secrets.md)."""
        rules = policy.rules if policy is not None else []
        if rules and self.secret_source is None:
            raise InvalidRequest("secret rules need the gateway's secrets "
                                 "(REPLGATE_SECRETS_KEY)")
        self.network = policy
        if self.state is not KernelState.READY:
            if self.egress is not None and (policy is not None or self.profile.egress_allow):
                self.egress.rules = self._egress_rules()  # the start under way serves it
                await self._broker_rules(rules, tenant, session_id)
            return
        await self._ensure_egress()
        if self.egress is not None:
            self.egress.session_id = session_id
            await self._broker_rules(rules, tenant, session_id)
            await self.set_env(self.proxy_env())

    async def _broker_rules(self, rules: list[SecretRule], tenant: str,
                            session_id: str | None) -> None:
        if self.egress is None or (not rules and self.egress.broker is None):
            return
        source = self.secret_source
        lookup = source(tenant, session_id) if source is not None else no_secrets
        await self.egress.set_broker(rules, lookup,
                                     upstream_cafile=self.egress_ca_file)

    def proxy_env(self) -> dict[str, str]:
        """The variables that route HTTP(S) through the sandbox's proxy (none without one),
        and those that make its clients trust its CA when the proxy brokers secrets."""
        return {**PROXY_ENV, **self.trust_env()} if self.egress is not None else {}

    def launcher_env(self) -> dict[str, str]:
        """The proxy variables the sandbox's launcher sets when the proxy serves as the kernel
        boots (it unsets ``NO_PROXY``): what a kernel restored from a template, which started
        without them, is given at its start."""
        if self.egress is None:
            return {}
        return {name: value for name, value in PROXY_ENV.items()
                if name.lower() != "no_proxy"}

    def trust_env(self) -> dict[str, str]:
        """The CA variables (:data:`~kernel_pool._sandbox_ca.TRUST_ENV`) while the sandbox's
        proxy brokers secrets, else none."""
        return dict(TRUST_ENV) if self.egress is not None and self.egress.broker else {}
