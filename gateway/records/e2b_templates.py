"""E2B's face of custom templates, its records: the builds its SDK asked (E2B's build ids, the
replgate build each started) and the templates' tags, for every gateway sharing the database
and a restarted one."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from common.store import Store, as_dict

__all__ = ["E2BBuildRecord", "E2BTemplateRecords"]


class E2BBuildRecord(BaseModel):
    """One of E2B's builds: asked (``core`` None) or started as replgate's build ``core``;
    ``steps``: E2B's step of each line of the Dockerfile it was translated to."""

    build_id: str
    tenant: str
    alias: str
    cpu_count: int
    memory_mb: int
    created_at: datetime
    core: str | None = None
    steps: list[str] | None = None


def _build(row: Any) -> E2BBuildRecord:
    data = as_dict(row)
    data["steps"] = None if data["steps"] is None else json.loads(data["steps"])
    return E2BBuildRecord.model_validate(data)


class E2BTemplateRecords(Store):
    """The store's E2B template builds and tags."""

    async def add_e2b_build(self, build: E2BBuildRecord) -> None:
        row = build.model_dump(mode="json")
        row["steps"] = None if build.steps is None else json.dumps(build.steps)
        await self._change(f"INSERT INTO e2b_template_builds ({', '.join(row)}) VALUES "
                           f"({', '.join(':' + name for name in row)})", **row)

    async def start_e2b_build(self, build_id: str, core: str, steps: list[str]) -> None:
        """Record the replgate build an asked build started as, and its steps."""
        await self._change("UPDATE e2b_template_builds SET core = :core, steps = :steps "
                           "WHERE build_id = :build_id", build_id=build_id, core=core,
                           steps=json.dumps(steps))

    async def e2b_build(self, tenant: str, build_id: str) -> E2BBuildRecord | None:
        rows = await self._fetch("SELECT * FROM e2b_template_builds WHERE build_id = :build_id "
                                 "AND tenant = :tenant", build_id=build_id, tenant=tenant)
        return _build(rows[0]) if rows else None

    async def e2b_builds_of(self, tenant: str, alias: str) -> list[E2BBuildRecord]:
        """The template's builds asked, oldest first."""
        rows = await self._fetch("SELECT * FROM e2b_template_builds WHERE tenant = :tenant AND "
                                 "alias = :alias ORDER BY created_at, build_id", tenant=tenant,
                                 alias=alias)
        return [_build(row) for row in rows]

    async def forget_e2b_template(self, tenant: str, alias: str) -> None:
        """Forget the template's builds and tags (it was deleted)."""
        for table in ("e2b_template_builds", "e2b_template_tags"):
            await self._change(f"DELETE FROM {table} WHERE tenant = :tenant AND alias = :alias",
                               tenant=tenant, alias=alias)

    async def set_e2b_tags(self, tenant: str, alias: str, build_id: str, tags: list[str],
                           at: datetime) -> None:
        """Tag the build ``tags`` (a tag held by another build moves to it)."""
        for tag in tags:
            await self._change(
                "INSERT INTO e2b_template_tags (tenant, alias, tag, build_id, created_at) "
                "VALUES (:tenant, :alias, :tag, :build_id, :at) ON CONFLICT (tenant, alias, tag) "
                "DO UPDATE SET build_id = :build_id, created_at = :at", tenant=tenant,
                alias=alias, tag=tag, build_id=build_id, at=at.isoformat())

    async def e2b_tags(self, tenant: str, alias: str) -> dict[str, tuple[str, datetime]]:
        """Each tag of the template: the build it names, and since when."""
        rows = await self._fetch("SELECT tag, build_id, created_at FROM e2b_template_tags "
                                 "WHERE tenant = :tenant AND alias = :alias", tenant=tenant,
                                 alias=alias)
        return {row["tag"]: (row["build_id"], datetime.fromisoformat(row["created_at"]))
                for row in rows}

    async def remove_e2b_tags(self, tenant: str, alias: str, tags: list[str]) -> None:
        for tag in tags:
            await self._change("DELETE FROM e2b_template_tags WHERE tenant = :tenant AND "
                               "alias = :alias AND tag = :tag", tenant=tenant, alias=alias,
                               tag=tag)
