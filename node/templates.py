"""Custom templates' profiles on nodes: the gateway sends a template's profile with each session
of it it places (:class:`TemplateProfiles`); a node adds the profile, its image loaded from the
bundle store first if its engine lacks it (:func:`add_template`; ``docs/cluster.md``).
"""

from __future__ import annotations

import logging

from kernel_pool import InvalidRequest, KernelPool, Profile
from kernel_pool.backends.docker import ensure_image, image_key
from kernel_pool.bundles import BundleNotFound, BundleStore
from node.wire import TemplateImage

logger = logging.getLogger(__name__)


async def add_template(pool: KernelPool, template: TemplateImage,
                       store: BundleStore | None) -> None:
    """Make ``template``'s profile one of ``pool``'s, its image on the engine first.

    The engine is asked each time (a cheap lookup): an image removed since, or never here,
    is loaded before a kernel of it is made. InvalidRequest when there is nothing to load
    it from (no store on this node, no image in it); ImageError when the load fails."""
    profile = template.profile
    if store is None:
        raise InvalidRequest(f"node cannot run template profile {profile.name!r}: it has no "
                             "bundle store (REPLGATE_BUNDLE_STORE) to load its image from")
    try:
        if await ensure_image(profile.image, template.key, store):
            logger.info("loaded image %s of template profile %s", profile.image, profile.name)
    except BundleNotFound as exc:
        raise InvalidRequest(f"the image of template profile {profile.name!r} is not in the "
                             f"bundle store ({template.key}): {exc}") from exc
    if pool.settings.profiles.get(profile.name) != profile:
        pool.set_profile(profile)


class TemplateProfiles:
    """The gateway's side: the template profiles added to a :class:`~node.placement.RemoteNodes`,
    each sent with the sessions placed of it (a node adds what it lacks: :func:`add_template`).
    Possible only with a bundle store, where the gateway saved each template's image."""

    def __init__(self, store: BundleStore | None) -> None:
        self.store = store
        self._added: dict[str, TemplateImage] = {}

    def add(self, profiles: dict[str, Profile], profile: Profile) -> None:
        """Add ``profile`` to the gateway's ``profiles``, to be sent with its sessions."""
        if self.store is None:
            raise InvalidRequest("custom templates on nodes need a bundle store "
                                 "(REPLGATE_BUNDLE_STORE) to carry their images to the nodes")
        profiles[profile.name] = profile
        self._added[profile.name] = TemplateImage(profile=profile, key=image_key(profile.image))

    def remove(self, profiles: dict[str, Profile], name: str) -> None:
        """Forget a profile :meth:`add` added (the nodes' idle kernels of it stay idle)."""
        if self._added.pop(name, None) is not None:
            profiles.pop(name, None)

    def sent_with(self, name: str) -> TemplateImage | None:
        """What a session of the profile ``name`` is placed with: its template, if it is one."""
        return self._added.get(name)
