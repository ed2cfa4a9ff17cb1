"""A kernel's network: the egress proxy of its sandbox, deciding by the session's network
policy (or the profile's ``egress_allow``) and brokering the policy's secret rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

from kernel_pool._allowlist import EgressRules
from kernel_pool._broker import SecretSource, no_secrets, upstream_context
from kernel_pool._broker_rules import SecretRule
from kernel_pool._channels import ENV_FILE, KernelChannels, KernelState
from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool._egress import SOCKET_NAME, EgressProxy
from kernel_pool._network import PROXY_ENV, NetworkPolicy, NetworkRules, profile_bound
from kernel_pool._sandbox_ca import TRUST_ENV, SandboxCA
from kernel_pool.backends.base import Sandbox
from kernel_pool.config import Profile
from kernel_pool.exceptions import InvalidRequest

logger = logging.getLogger(__name__)


class KernelNetwork(KernelChannels):
    """The network side of :class:`~kernel_pool._kernel.Kernel`."""

    sandbox: Sandbox
    profile: Profile
    env: dict[str, str]

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
        self.ca: SandboxCA | None = None
        """The sandbox's CA for its broker, made and its bundle placed as the kernel starts
        (:meth:`_ca_ahead`) when a session could bring secret rules: not on a claim's path."""
        self._published: dict[str, str] | None = None

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
        only if the proxy was there when it started), before its next execution
        (:meth:`publish_env`). The policy's secret ``rules`` are
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
            await self.publish_env()

    async def _broker_rules(self, rules: list[SecretRule], tenant: str,
                            session_id: str | None) -> None:
        if self.egress is None or (not rules and self.egress.broker is None):
            return
        source = self.secret_source
        lookup = source(tenant, session_id) if source is not None else no_secrets
        await self.egress.set_broker(rules, lookup, upstream_cafile=self.egress_ca_file,
                                     ca=self.ca)

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

    async def publish_env(self) -> None:
        """Give the running kernel the session's variables (its ``env``, then the proxy's):
        written in :data:`~kernel_pool._channels.ENV_FILE`, which the kernel applies before
        its next execution, so a claim waits for no round trip to it. A kernel that does not
        read the file (an older image's), or a file that cannot be written (the sandbox
        filled its socket folder), gets them by :meth:`set_env` instead."""
        env = {**self.env, **self.proxy_env()}
        if env == self._published:
            return
        if self.takes_env_file:
            try:
                # A few hundred bytes on the socket folder's tmpfs: cheaper on the loop than
                # a worker thread's hop, and this is a claim's path.
                _place(Path(self.sandbox.info.socket_dir), ENV_FILE,
                       json.dumps(env).encode())
            except OSError as exc:
                logger.warning("kernel %s: writing its %s failed (%s); setting its variables "
                               "by an execution", self.id, ENV_FILE, exc)
            else:
                self._published = env
                return
        await self.set_env(env)
        self._published = env

    def _ca_ahead(self) -> asyncio.Task[None] | None:
        """Make the sandbox's CA and place its bundle (and warm the broker's upstream TLS
        context) beside a starting kernel, when a session of its profile could bring secret
        rules: a claim with rules then only hands them to the proxy."""
        if self.ca is not None or self.secret_source is None:
            return None
        bound = profile_bound(self.profile.egress_allow, self.profile.network_max)
        if bound.default != "allow" and not bound.allow:
            return None
        return asyncio.create_task(asyncio.to_thread(self._make_ca), name=f"ca-{self.id}")

    def _make_ca(self) -> None:
        """(In a worker thread.) A failure leaves the CA to the first claim with rules."""
        try:
            ca = SandboxCA(self.id)
            ca.write_bundle(Path(self.sandbox.info.socket_dir), (SANDBOX_UID, SANDBOX_GID))
            upstream_context(self.egress_ca_file)
        except (OSError, ValueError) as exc:
            logger.warning("kernel %s: making its egress CA ahead failed (%s); a session with "
                           "secret rules makes it", self.id, exc)
            return
        self.ca = ca


def _place(socket_dir: Path, name: str, data: bytes) -> None:
    """Write ``name`` in the sandbox's socket folder: staged in a private file beside it and
    renamed in (the folder is the sandbox's to write, and no path in it is followed)."""
    fd, staged = tempfile.mkstemp(dir=socket_dir.parent, prefix=f".{socket_dir.name}.env-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if os.geteuid() == 0:
            os.chown(staged, SANDBOX_UID, SANDBOX_GID)
        os.chmod(staged, 0o444)
        os.rename(staged, socket_dir / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
