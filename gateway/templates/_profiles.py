"""Custom templates as profiles of the host: the name a session asks for resolved to a template
build's profile (one another gateway built made a profile here on demand), and the profiles'
warm kernels sized by their use."""

from __future__ import annotations

import asyncio

from common.errors import Conflict, NotFound
from common.settings import Settings
from gateway.doctor import ensure_image, image_key
from gateway.store import Store
from gateway.templates._models import ID_PREFIX
from gateway.wire import TemplateInfo, TemplateStatus
from kernel_pool import BundleNotFound, BundleStore, Profile, SessionHost

RESOLVED_FOR_S = 5.0
"""How long a name resolved to a profile is taken as it is: another gateway's rebuild, delete
or publish is seen by then."""
WARM_CHECK_S = 30.0
"""How often profiles unused for ``REPLGATE_TEMPLATE_WARM_S`` are shrunk to no warm kernel."""


class ResolvedProfiles:
    """The profile side of :class:`~gateway.templates.Templates` (its attributes, set there)."""

    host: SessionHost
    settings: Settings
    store: Store
    images: BundleStore | None
    _resolved: dict[tuple[str, str], tuple[str, float]]
    _used: dict[str, float]

    def _profile(self, name: str, image: str, min_idle: int, *, start_cmd: str | None,
                 ready_cmd: str | None) -> Profile:
        """A template's profile: the default profile's limits, its own image, and its start
        and ready commands (each kernel's sandbox runs them before the kernel answers)."""
        return self.settings.limits.model_copy(update={
            "name": name, "image": image, "min_idle": min_idle, "start_cmd": start_cmd,
            "ready_cmd": ready_cmd})

    async def profile_for(self, tenant: str, name: str) -> str:
        """The profile a session asking for ``name`` runs on: a template's (by its name, id or
        profile) if the tenant may use it, else ``name`` itself (an operator's profile)."""
        if name in self.host.settings.profiles and not name.startswith(ID_PREFIX):
            return name
        now = asyncio.get_running_loop().time()
        known, since = self._resolved.get((tenant, name), ("", 0.0))
        if known in self.host.settings.profiles and now - since < RESOLVED_FOR_S:
            self._warm(known)
            return known
        key = name.rsplit("-", 1)[0] if name.startswith(ID_PREFIX) else name
        info = await self.store.find_template(tenant, key)
        if info is None:
            if name.startswith(ID_PREFIX):
                raise NotFound(f"no template {name!r}; GET /v1/templates lists yours")
            return name
        if info.status is not TemplateStatus.READY and info.image is None:
            raise Conflict(f"template {info.name!r} is {info.status.value}, not ready")
        profile = name if name.startswith(ID_PREFIX) and name in self.host.settings.profiles \
            else info.profile
        if profile not in self.host.settings.profiles and info.image is not None:
            await self._add_built(info)  # built by another gateway, since this one started
        self._resolved[(tenant, name)] = (profile, now)
        self._warm(profile)
        return profile

    async def profiles_of(self, tenant: str) -> set[str]:
        """The template profiles the tenant may start sessions of: each of its own and the
        published templates' current build, once ready."""
        return {info.profile for info in await self.store.list_templates(tenant)
                if info.image is not None}

    async def _add_built(self, info: TemplateInfo) -> None:
        """Make the template's current build a profile here; on this machine, its image loaded
        from the bundle store first if the engine lacks it (nodes load it themselves)."""
        assert info.image is not None
        if not self.host.adds_profiles:
            raise Conflict(f"template {info.name!r} cannot run here: this gateway's nodes "
                           "have no bundle store to load its image from")
        if self.images is not None and self.settings.hosts_sessions:
            try:
                await ensure_image(info.image, image_key(info.image), self.images)
            except BundleNotFound as exc:
                raise Conflict(f"template {info.name!r} was built on another machine and its "
                               "image is not in the bundle store") from exc
        self.host.set_profile(self._profile(info.profile, info.image, 0,
                                            start_cmd=info.start_cmd, ready_cmd=info.ready_cmd))

    def _warm(self, name: str) -> None:
        """A session of the profile is being made: keep one warm kernel of it for a while."""
        self._used[name] = asyncio.get_running_loop().time()
        current = self.host.settings.profiles.get(name)
        if current is not None and current.min_idle == 0 and self.settings.template_warm_s > 0:
            self.host.set_profile(current.model_copy(update={"min_idle": 1}))

    async def _shrink_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WARM_CHECK_S)
            for name, used in list(self._used.items()):
                if loop.time() - used < self.settings.template_warm_s:
                    continue
                del self._used[name]
                current = self.host.settings.profiles.get(name)
                if current is not None and current.min_idle:  # a template's profile sets it, 0 or 1
                    self.host.set_profile(current.model_copy(update={"min_idle": 0}))
