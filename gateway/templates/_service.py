"""Custom templates, the use cases: a tenant's build started, followed, listed and deleted.

Skeleton (the interface agreed with the E2B face); the bodies come next.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.service import Gateway
from gateway.templates._models import BuildSpec, LogLine, TemplateInfo


class Templates:
    """The tenants' custom templates: their builds on the engine and their records."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def start(self, tenant: str, spec: BuildSpec) -> TemplateInfo:
        """Start a build (a new template, or a rebuild of the tenant's template of that name)
        and return at once with status ``building``; TooManyRequests past the quota."""
        raise NotImplementedError

    async def get(self, tenant: str, id_or_name: str) -> TemplateInfo:
        """The tenant's template (or a published one) by id or name; NotFound otherwise."""
        raise NotImplementedError

    async def list(self, tenant: str) -> list[TemplateInfo]:
        """The tenant's templates and the published ones, newest first."""
        raise NotImplementedError

    async def logs(self, tenant: str, id_or_name: str, *, offset: int = 0,
                   build_id: str | None = None) -> list[LogLine]:
        """The lines of a build's log from ``offset`` (default: the latest build)."""
        raise NotImplementedError

    def follow(self, tenant: str, id_or_name: str, *, offset: int = 0) -> AsyncIterator[LogLine]:
        """The latest build's lines from ``offset`` as they come, ending with the build."""
        raise NotImplementedError

    async def wait(self, tenant: str, id_or_name: str, timeout: float) -> TemplateInfo:
        """The template once its latest build has ended (or as it is after ``timeout``)."""
        raise NotImplementedError

    async def delete(self, tenant: str, id_or_name: str) -> None:
        """Forget the tenant's template and remove its images (a build under way is ended)."""
        raise NotImplementedError
