"""What the gateway asks of custom templates when a profile is named (:mod:`gateway.templates`
answers; :class:`~gateway.service.Gateway` holds it without importing it)."""

from __future__ import annotations

from typing import Protocol

TEMPLATE_PREFIX = "tpl_"
"""A template's id starts so, and so does each of its builds' profiles (``<id>-<build>``)."""


class TemplateProfiles(Protocol):
    """The tenants' templates as profiles of the host."""

    async def profile_for(self, tenant: str, name: str) -> str:
        """The profile a tenant's session asking for ``name`` runs on (a template's name, id
        or profile resolved, if the tenant may use it; NotFound if not), else ``name``."""

    async def profiles_of(self, tenant: str) -> set[str]:
        """The template profiles the tenant may start sessions of (each template's current
        build: its own and the published ones)."""
