"""Custom templates: a tenant's image built from a Dockerfile on the engine, made a sandbox by
replgate and usable as a profile (``docs/templates.md``)."""

from gateway.templates._models import BuildSpec
from gateway.templates._service import Templates
from gateway.wire import LogLine, TemplateInfo, TemplateStatus

__all__ = ["BuildSpec", "LogLine", "TemplateInfo", "TemplateStatus", "Templates"]
