"""Custom templates' records: each template as its latest build left it, and its builds with
their logs, for every gateway sharing the database (the images are the engine's)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError

from common.store import RecordExists, Store, as_dict
from gateway.wire import LogLine, TemplateInfo

__all__ = ["TemplateRecords"]

_JSON_COLUMNS = ("languages", "lacks")


def _row(info: TemplateInfo) -> dict[str, Any]:
    row = info.model_dump(mode="json")
    for name in _JSON_COLUMNS:
        row[name] = json.dumps(row[name])
    row["public"] = int(info.public)
    return row


def _info(row: Any) -> TemplateInfo:
    data = as_dict(row)
    for name in _JSON_COLUMNS:
        data[name] = json.loads(data[name])
    data["public"] = bool(data["public"])
    return TemplateInfo.model_validate(data)


class TemplateRecords(Store):
    """The store's custom templates and their builds."""

    async def add_template(self, info: TemplateInfo) -> None:
        """Record a new template; :class:`RecordExists` when its tenant has one of its name."""
        row = _row(info)
        try:
            await self._change(f"INSERT INTO templates ({', '.join(row)}) VALUES "
                               f"({', '.join(':' + name for name in row)})", **row)
        except IntegrityError as exc:
            raise RecordExists("template", info.name) from exc

    async def update_template(self, info: TemplateInfo) -> None:
        """Write the template's state (a build started or ended, published)."""
        row = _row(info)
        sets = ", ".join(f"{name} = :{name}" for name in row if name != "id")
        await self._change(f"UPDATE templates SET {sets} WHERE id = :id", **row)

    async def find_template(self, tenant: str, id_or_name: str) -> TemplateInfo | None:
        """The tenant's template of that id or name, else a published one of that id or
        name, else None."""
        rows = await self._fetch(
            "SELECT * FROM templates WHERE (id = :key OR name = :key) AND "
            "(tenant = :tenant OR public = 1) ORDER BY tenant = :tenant DESC",
            key=id_or_name, tenant=tenant)
        return _info(rows[0]) if rows else None

    async def template_by_id(self, template_id: str) -> TemplateInfo | None:
        """The template of that id, whoever's (an operator's request), or None."""
        rows = await self._fetch("SELECT * FROM templates WHERE id = :id", id=template_id)
        return _info(rows[0]) if rows else None

    async def template_by_profile(self, profile: str) -> TemplateInfo | None:
        """The template whose profile that is (whoever's), or None."""
        rows = await self._fetch("SELECT * FROM templates WHERE profile = :profile",
                                 profile=profile)
        return _info(rows[0]) if rows else None

    async def list_templates(self, tenant: str | None = None) -> list[TemplateInfo]:
        """The tenant's templates and the published ones (every one: None), newest first."""
        where = "" if tenant is None else "WHERE tenant = :tenant OR public = 1"
        rows = await self._fetch(f"SELECT * FROM templates {where} ORDER BY created_at DESC, "
                                 "id", **({} if tenant is None else {"tenant": tenant}))
        return [_info(row) for row in rows]

    async def count_templates(self, tenant: str) -> int:
        rows = await self._fetch("SELECT COUNT(*) AS n FROM templates WHERE tenant = :tenant",
                                 tenant=tenant)
        return int(rows[0]["n"])

    async def delete_template_record(self, template_id: str) -> None:
        """Forget a template and its builds."""
        await self._change("DELETE FROM template_builds WHERE template_id = :id", id=template_id)
        await self._change("DELETE FROM templates WHERE id = :id", id=template_id)

    async def add_build(self, build_id: str, info: TemplateInfo, started_at: datetime) -> None:
        await self._change(
            "INSERT INTO template_builds (id, template_id, tenant, status, started_at, log) "
            "VALUES (:id, :template_id, :tenant, :status, :started_at, '[]')", id=build_id,
            template_id=info.id, tenant=info.tenant, status=info.status.value,
            started_at=started_at.isoformat())

    async def end_build(self, build_id: str, info: TemplateInfo, lines: list[LogLine],
                        finished_at: datetime) -> None:
        """Record how a build ended, with its log."""
        log = json.dumps([line.model_dump(mode="json") for line in lines])
        await self._change(
            "UPDATE template_builds SET status = :status, error = :error, "
            "finished_at = :finished_at, log = :log WHERE id = :id", id=build_id,
            status=info.status.value, error=info.error, finished_at=finished_at.isoformat(),
            log=log)

    async def build_log(self, build_id: str) -> list[LogLine] | None:
        """A build's log as recorded when it ended (None: no such build)."""
        rows = await self._fetch("SELECT log FROM template_builds WHERE id = :id", id=build_id)
        if not rows:
            return None
        return [LogLine.model_validate(line) for line in json.loads(rows[0]["log"])]

    async def unfinished_builds(self) -> list[str]:
        """Builds recorded as under way (a gateway that ran them stopped)."""
        rows = await self._fetch("SELECT id FROM template_builds WHERE finished_at IS NULL")
        return [row["id"] for row in rows]
