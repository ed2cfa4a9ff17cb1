"""E2B's secrets API (``e2b.Secret``) on replgate's tenants' secrets (:mod:`gateway.secrets`,
docs/secrets.md): the same write-only store, so a secret made here is the one a session's rule
names, whichever API made either.

- ``POST /secrets`` (``name``, ``value``, ``metadata``): 201 with the secret's metadata, 409 if
  the tenant has one of that name. Names are E2B's (letters, digits, ``_``, ``-``), stored
  lower-cased as E2B does; replgate's are at most 64 characters.
- ``GET /secrets`` (``limit``, ``nextToken``): by name, a page at a time (``X-Next-Token``).
- ``GET``, ``POST`` (a new value: one more version), ``DELETE /secrets/{secretID}``: by id
  (``sec_`` and a digest of the tenant and the name, stable) or by name; 404 for none.

No answer carries a value: E2B's ``Secret`` model has no field for one.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import BaseModel, Field, field_validator

from gateway.e2b._errors import E2BError, E2BRoute
from gateway.e2b._models import Lenient
from gateway.e2b._tenant import TenantDep
from gateway.records.secrets import SecretRecord
from gateway.secrets import Secrets

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)

ID_PREFIX = "sec_"
E2B_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_NAME = 64
MAX_ENTRIES, MAX_KEY_BYTES, MAX_VALUE_BYTES, MAX_METADATA_BYTES = 32, 128, 1024, 8192


async def get_secrets(request: Request) -> Secrets:
    secrets: Secrets = request.app.state.secrets
    return secrets


SecretsDep = Annotated[Secrets, Depends(get_secrets)]


def _metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """E2B's limits on a secret's metadata, or its 400."""
    if value is None:
        return None
    if len(value) > MAX_ENTRIES:
        raise ValueError(f"metadata has at most {MAX_ENTRIES} entries")
    total = 0
    for key, text in value.items():
        if len(key.encode()) > MAX_KEY_BYTES or len(text.encode()) > MAX_VALUE_BYTES:
            raise ValueError(f"metadata keys are at most {MAX_KEY_BYTES} bytes and values at "
                             f"most {MAX_VALUE_BYTES}")
        total += len(key.encode()) + len(text.encode())
    if total > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is at most {MAX_METADATA_BYTES} bytes in all")
    return value


class SecretUpdate(Lenient):
    """E2B's ``SecretUpdate``: a new value and, when given, new metadata."""

    value: str = Field(repr=False)
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _metadata(value)


class NewSecret(SecretUpdate):
    """E2B's ``NewSecret``: a name, with what an update gives."""

    name: str


class SecretInfo(BaseModel):
    """E2B's ``Secret``: a secret's metadata, never its value."""

    secretID: str
    name: str
    currentVersion: int
    metadata: dict[str, str]
    createdAt: datetime
    updatedAt: datetime


def secret_id(tenant: str, name: str) -> str:
    """A secret's E2B id: stable for the tenant's name, naming neither."""
    return ID_PREFIX + hashlib.sha256(f"{tenant}\0{name}".encode()).hexdigest()[:24]


def _info(tenant: str, record: SecretRecord) -> SecretInfo:
    return SecretInfo(secretID=secret_id(tenant, record.name), name=record.name,
                      currentVersion=record.version, metadata=record.metadata,
                      createdAt=record.created_at, updatedAt=record.updated_at)


def _new_name(name: str) -> str:
    if not E2B_NAME.fullmatch(name):
        raise E2BError(400, "a secret's name is 1 to 128 letters, digits, '_' or '-'")
    if name.lower().startswith(ID_PREFIX):
        raise E2BError(400, f"a secret's name must not start with {ID_PREFIX!r} (secret ids do)")
    if len(name) > MAX_NAME or name.startswith("-"):
        raise E2BError(400, f"replgate's secret names are at most {MAX_NAME} characters and "
                            "start with a letter, a digit or '_'")
    return name.lower()


async def _find(secrets: Secrets, tenant: str, selector: str) -> SecretRecord:
    """The tenant's secret by id or name, or E2B's 404."""
    if selector.startswith(ID_PREFIX):
        found = next((record for record in await secrets.list(tenant)
                      if secret_id(tenant, record.name) == selector), None)
    else:
        found = await secrets.info(tenant, selector.lower())
    if found is None:
        raise E2BError(404, f"secret {selector!r} not found")
    return found


@router.post("/secrets", status_code=status.HTTP_201_CREATED)
async def create_secret(body: NewSecret, tenant: TenantDep,
                        secrets: SecretsDep) -> SecretInfo:
    """``Secret.create``: a new secret, version 1."""
    record = await secrets.create(tenant, _new_name(body.name), body.value,
                                  body.metadata or {})
    return _info(tenant, record)


@router.get("/secrets")
async def list_secrets(
        response: Response, tenant: TenantDep, secrets: SecretsDep,
        limit: Annotated[int, Query(ge=1, le=100)] = 100,
        next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[SecretInfo]:
    """``Secret.list``: by name, ``X-Next-Token`` (the page's last name) while more follow."""
    found = await secrets.list(tenant)
    if next_token is not None:
        found = [record for record in found if record.name > next_token]
    if len(found) > limit:
        response.headers["X-Next-Token"] = found[limit - 1].name
    return [_info(tenant, record) for record in found[:limit]]


@router.get("/secrets/{selector}")
async def get_secret(selector: str, tenant: TenantDep, secrets: SecretsDep) -> SecretInfo:
    """``Secret.get_info``: by id or name."""
    return _info(tenant, await _find(secrets, tenant, selector))


@router.post("/secrets/{selector}")
async def update_secret(selector: str, body: SecretUpdate, tenant: TenantDep,
                        secrets: SecretsDep) -> SecretInfo:
    """``Secret.update``: a new value (the next request a rule matches uses it), one more
    version, and the metadata when given."""
    found = await _find(secrets, tenant, selector)
    return _info(tenant, await secrets.update(tenant, found.name, body.value, body.metadata))


@router.delete("/secrets/{selector}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_secret(selector: str, tenant: TenantDep, secrets: SecretsDep) -> Response:
    """``Secret.destroy``: requests that would use it are refused from now on."""
    found = await _find(secrets, tenant, selector)
    await secrets.delete(tenant, found.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
