"""Settings of gateways and nodes, from ``REPLGATE_*`` environment variables. Every one has a
default.

Nested with ``__``: the pool's own models are fields here, so each of their settings is
reachable from the environment and its default is stated once, in :mod:`kernel_pool.config`::

    REPLGATE_POOL__MAX_KERNELS=16             PoolLimits (kernels, clocks, owner label)
    REPLGATE_LIMITS__MEMORY=4g                the default Profile (image, limits, timeouts)
    REPLGATE_LIMITS__CAPS__STREAM_CHARS=50000 its OutputCaps

The flat names docs/configuration.md documents (``REPLGATE_MAX_KERNELS``, ``REPLGATE_MEMORY``,
...) keep working (:data:`FLAT_NAMES`); where both are set, the nested one wins. Nothing reads the
environment at import time: ``Settings()`` does, when the CLI builds the app.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from common.paths import default_state_dir
from kernel_pool import NetworkPolicy, PoolLimits, PoolSettings, Profile, parse_size
from kernel_pool.config import check_bundle_store, decode_bundle_key

ENV_PREFIX = "REPLGATE_"

FLAT_NAMES: dict[str, tuple[str, ...]] = {
    "image": ("limits", "image"),
    "min_idle": ("limits", "min_idle"),
    "runtime": ("limits", "runtime"),
    "memory": ("limits", "memory"),
    "cpus": ("limits", "cpus"),
    "pids": ("limits", "pids"),
    "tmp_size": ("limits", "tmp_size"),
    "workspace_size": ("limits", "workspace_size"),
    "default_timeout_s": ("limits", "default_timeout_s"),
    "max_timeout_s": ("limits", "max_timeout_s"),
    "stream_chars": ("limits", "caps", "stream_chars"),
    "max_output_bytes": ("limits", "caps", "display_bytes"),
    "max_kernels": ("pool", "max_kernels"),
    "capacity_wait_s": ("pool", "capacity_wait_s"),
    "interrupt_grace_s": ("pool", "interrupt_grace_s"),
    "max_queued_executions": ("pool", "max_queued_executions"),
    "max_commands": ("pool", "max_commands"),
    "idle_ttl_s": ("pool", "idle_ttl_s"),
    "max_lifetime_s": ("pool", "max_lifetime_s"),
    "owner": ("pool", "owner"),
    "pause_after_s": ("pool", "pause_after_s"),
    "snapshot_budget": ("pool", "snapshot_budget"),
    "memory_reserve": ("pool", "memory_reserve"),
    "pause_with": ("pool", "pause_with"),
    "kernel_templates": ("pool", "kernel_templates"),
    "template_dir": ("pool", "template_dir"),
    "egress_ca_file": ("pool", "egress_ca_file"),
}
"""``REPLGATE_<flat name>`` -> the nested setting it sets (the names of replgate 0.1)."""


class _FlatNames(PydanticBaseSettingsSource):
    """The flat ``REPLGATE_*`` names of :data:`FLAT_NAMES`, read from the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the names itself

    def __call__(self) -> dict[str, Any]:
        environ = {key.upper(): value for key, value in os.environ.items()}
        return {name: environ[ENV_PREFIX + name.upper()] for name in FLAT_NAMES
                if ENV_PREFIX + name.upper() in environ}


class Settings(BaseSettings):
    """Configuration of ``replgate serve``; each field is ``REPLGATE_<NAME>`` in the environment,
    nested fields ``REPLGATE_<NAME>__<FIELD>``."""

    # hide_input_in_errors: a refused key or database URL (with its password) is not quoted
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__",
                                      extra="ignore", hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="address to bind; 127.0.0.1 keeps it local")
    port: int = Field(8000, ge=0, le=65535)
    state_dir: Path = Field(default_factory=default_state_dir,
                            description="SQLite database, audit log, keys, workspaces, sockets")
    database_url: str | None = Field(
        None, description="where shared state lives (sessions, history, keys, the audit "
        "chain): unset, SQLite in the state directory (replgate.db, one gateway); "
        "postgresql://user:password@host:5432/db, a PostgreSQL database several gateways "
        "share (its schema is migrated at start-up)")
    api_keys: str | None = Field(None, description="tenant:key pairs, comma-separated")
    log_json: bool = Field(False, description="log as JSON lines")
    log_level: str = "info"
    http_keep_alive_s: int = Field(
        310, ge=1, description="how long an idle HTTP connection stays open: longer than "
        "clients keep idle connections to reuse (the E2B SDK 300 s, httpx 5 s), so that a "
        "client never sends a request on a connection the gateway is closing that moment")

    e2b_domain: str | None = Field(
        None,
        description="the domain under which the gateway answers E2B's host names, for E2B's "
        "SDK releases 2.0 to 2.6 (E2B_DOMAIN): api.DOMAIN is /e2b, PORT-ID.DOMAIN a sandbox's "
        "port; TLS and the *.DOMAIN DNS record are the deployment's (docs/e2b.md); unset: "
        "hosts are not looked at")

    # many machines (docs/cluster.md)
    local_node: bool | None = Field(
        None, description="run sessions in this process: unset, yes without a database URL "
        "or with a sqlite:// one (one machine) and no with a postgresql:// one (sessions then "
        "run on `replgate node` processes registered in that database)")
    tls_ca: Path | None = Field(None, description="PEM: the CA whose certificates gateways and "
                                "nodes accept from each other (mutual TLS)")
    tls_cert: Path | None = Field(None, description="PEM: this process's certificate, signed by "
                                  "REPLGATE_TLS_CA")
    tls_key: Path | None = Field(None, description="PEM: the key of REPLGATE_TLS_CERT")
    tls_check_node_names: bool = Field(
        True, description="a gateway checks that a node's certificate names the address it "
        "dials; false: any server certificate of REPLGATE_TLS_CA is a node (Kubernetes, where "
        "a pod's address is not known when its certificate is made)")
    admin_keys: str | None = Field(None, description="bare keys, comma-separated, of operators: "
                                   "GET /v1/nodes, drain and undrain")
    node_timeout_s: float = Field(
        10.0, gt=0, description="a node that has not sent a heartbeat for this long is down: "
        "its sessions are placed again elsewhere when next used (nodes beat every third of it)")
    bundle_store: str | None = Field(
        None, description="where paused sessions are kept for any node to resume them "
        "(docs/bundles.md): s3://bucket/prefix (credentials, region and endpoint from the AWS_* "
        "variables, AWS_ENDPOINT_URL for an S3-compatible server) or file:///path (a file "
        "system the nodes share); unset: a paused session stays on its node")
    bundle_key: SecretStr | None = Field(
        None, description="base64 of 32 or more random bytes, the same on every node: each "
        "tenant's bundles are encrypted with a key derived from it; required for s3://")

    secrets_key: SecretStr | None = Field(
        None, description="base64 of 32 or more random bytes: tenants' secrets (PUT "
        "/v1/secrets/{name}, docs/secrets.md) are encrypted at rest with a key derived from "
        "it, the same on every gateway of a database; unset: the secrets API answers 409")

    # the pool
    pool: PoolLimits = Field(default_factory=PoolLimits,
                             description="kernels in all, clocks, the containers' owner label")
    limits: Profile = Field(default_factory=Profile,
                            description="the default profile: image, limits, timeouts, caps")
    keep_sessions_on_stop: bool = Field(
        True, description="a stop (SIGTERM, SIGINT) leaves running sessions running and paused "
        "ones paused, for the next start to take back; false: a stop deletes every session")
    state_min_free: str = Field("256m", description="free disk the state directory must keep: "
                                "below it, new sessions and executions get 507")

    # requests
    max_code_bytes: int = Field(1_000_000, ge=1, description="largest code of one execution")
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1)
    max_download_bytes: int = Field(100 * 1024 * 1024, ge=1)
    max_sessions_per_tenant: int = Field(32, ge=1)
    max_concurrent_executions_per_tenant: int = Field(16, ge=1)
    max_snapshots_per_tenant: int = Field(
        64, ge=0, description="saved snapshots (E2B's create_snapshot) a tenant may keep; "
        "more gives 429")
    max_snapshot_bytes_per_tenant: str = Field(
        "20g", description="what a tenant's saved snapshots may take in the bundle store in "
        "all (variables and files); a snapshot past it is removed and refused with 429")

    @field_validator("max_snapshot_bytes_per_tenant")
    @classmethod
    def _snapshot_bytes(cls, value: str) -> str:
        parse_size(value)
        return value

    # custom templates (docs/templates.md)
    max_templates_per_tenant: int = Field(
        32, ge=0, description="custom templates a tenant may keep; one more gives 429")
    max_template_builds_per_tenant: int = Field(
        2, ge=1, description="template builds a tenant may run at once on a gateway; one more "
        "gives 429")
    max_template_image_bytes: str = Field(
        "8g", description="largest image a template's build may make (the base's layers "
        "included); a larger one fails its build and is removed")
    template_step_timeout_s: float = Field(
        600.0, gt=0, le=3600, description="how long one step of a template's build may take, "
        "unless the build asks for less or more; a step past it fails the build")
    template_warm_s: float = Field(
        600.0, ge=0, description="a template's profile keeps a warm kernel this long after its "
        "last session's create, then none (a template nobody uses holds no kernel); 0: never a "
        "warm kernel (each session of a template starts from its kernel template)")

    @field_validator("max_template_image_bytes")
    @classmethod
    def _template_bytes(cls, value: str) -> str:
        parse_size(value)
        return value
    max_unrecorded_executions: int = Field(
        256, ge=1, description="executions answered before their history and audit records "
                               "are written, at most: past it an execution over HTTP is "
                               "answered once its own are, and past four times it new "
                               "executions get 429 until the records catch up")
    allowed_origins: list[str] = Field(default_factory=list,
                                       description="browser origins allowed on WebSockets "
                                                   "besides the gateway's own")

    # governance (gateway/governance/)
    policy_file: Path | None = Field(None, description="TOML policy: rules, approvals, budgets, "
                                                       "profiles (docs/policy.example.toml)")
    approver_keys: str | None = Field(None, description="tenant:name:key triples, "
                                                        "comma-separated: people who approve")
    approval_timeout_s: float = Field(600.0, gt=0, description="a held execution expires after")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FlatNames(settings_cls), dotenv_settings,
                file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_names(cls, data: Any) -> Any:
        """Move flat names (from the environment or keyword arguments) to their nested place,
        unless the nested setting is given too."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, path in FLAT_NAMES.items():
            if name not in data:
                continue
            value = data.pop(name)
            parent = data
            for key in path[:-1]:
                child = parent.get(key)
                child = dict(child) if isinstance(child, dict) else (
                    child.model_dump(exclude_unset=True) if child is not None else {})
                parent[key] = child
                parent = child
            parent.setdefault(path[-1], value)
        return data

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        # Imported here: `replgate mcp` reads these settings without the serve extra.
        from common.database import DatabaseError, database_url

        if "://" not in value:  # (database_url reads a bare path as SQLite's: not this one)
            raise ValueError("must be postgresql://user:password@host:5432/database or "
                             "sqlite:////path/to/file.db")
        try:
            database_url(value)
        except DatabaseError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _bundle_store(self) -> Settings:
        # (a bare path, a URL of another scheme or a bad key would fail at the first pause)
        if self.bundle_store:
            check_bundle_store(self.bundle_store, self.bundle_key, need_key=self.hosts_sessions)
        elif self.bundle_key is not None:
            decode_bundle_key(self.bundle_key.get_secret_value())
        return self

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        import logging

        if not isinstance(logging.getLevelName(value.upper()), int):
            raise ValueError("must be one of debug, info, warning, error, critical")
        return value

    @field_validator("e2b_domain")
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", value):
            raise ValueError("must be a domain name, e.g. e2b.example.com")
        return value

    @field_validator("api_keys")
    @classmethod
    def _api_keys(cls, value: str | None) -> str | None:
        if value:
            from common.keys import parse_api_keys_setting

            parse_api_keys_setting(value)
        return value

    @field_validator("secrets_key")
    @classmethod
    def _secrets_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            from common.keys import decode_secrets_key

            decode_secrets_key(value.get_secret_value())
        return value

    @field_validator("state_min_free")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)
        return value

    @model_validator(mode="after")
    def _approver_keys(self) -> Settings:
        if not self.approver_keys:
            return self
        from common.keys import parse_api_keys_setting, parse_approver_keys

        approvers = {key for _, key in parse_approver_keys(self.approver_keys)}
        agents = {k for keys in parse_api_keys_setting(self.api_keys or "").values() for k in keys}
        if approvers & agents:
            raise ValueError("a key is both in REPLGATE_API_KEYS and REPLGATE_APPROVER_KEYS; "
                             "give approvers keys of their own")
        return self

    @model_validator(mode="after")
    def _tls(self) -> Settings:
        given = [f for f in ("tls_ca", "tls_cert", "tls_key") if getattr(self, f) is not None]
        if given and len(given) != 3:
            raise ValueError("set all of REPLGATE_TLS_CA, REPLGATE_TLS_CERT and REPLGATE_TLS_KEY, "
                             "or none")
        for name in given:
            path: Path = getattr(self, name)
            if not path.is_file():
                raise ValueError(f"{ENV_PREFIX}{name.upper()}={str(path)!r} is not a file: name "
                                 "a PEM file (docs/cluster.md says how to make them)")
        return self

    @property
    def hosts_sessions(self) -> bool:
        """Whether this gateway runs sessions itself (see ``local_node``): by default unless
        its database is one several machines share (a SQLite file is one machine's)."""
        if self.local_node is not None:
            return self.local_node
        return self.database_url is None or self.database_url.startswith("sqlite")

    def serve_refusal(self) -> str | None:
        """Why a gateway cannot start with these settings together, or None."""
        if not self.hosts_sessions and not (self.tls_ca and self.tls_cert and self.tls_key):
            return ("a gateway whose sessions run on nodes (REPLGATE_DATABASE_URL postgresql://, "
                    "REPLGATE_LOCAL_NODE not true) needs REPLGATE_TLS_CA, REPLGATE_TLS_CERT and "
                    "REPLGATE_TLS_KEY: gateways and nodes talk over mutual TLS only; or set "
                    "REPLGATE_LOCAL_NODE=true to run sessions in the gateway")
        return None

    @property
    def db_path(self) -> Path:
        """The embedded SQLite database (used when ``database_url`` is unset)."""
        return self.state_dir / "replgate.db"

    @property
    def database(self) -> str | Path:
        """The database to open: ``database_url``, else :attr:`db_path`."""
        return self.database_url or self.db_path

    def pool_settings(self) -> PoolSettings:
        profile = self.limits.model_copy(update={"name": "default"})
        pool = self.pool.model_dump()
        pool["egress_guarded"] = [*pool["egress_guarded"], *self._own_hosts()]
        return PoolSettings(state_dir=self.state_dir, profiles={"default": profile},
                            keep_sessions_on_close=self.keep_sessions_on_stop, **pool)

    def _own_hosts(self) -> list[str]:
        """The hosts of the cluster's database and bundle store: no session policy reaches
        them (kernel_pool's ``egress_guarded``)."""
        urls = [self.database_url or "", os.environ.get("AWS_ENDPOINT_URL", "")
                if (self.bundle_store or "").startswith("s3://") else ""]
        hosts = []
        for url in urls:
            with contextlib.suppress(ValueError):  # one a policy entry cannot name: none
                host = urlsplit(url).hostname if "://" in url else None
                if host and NetworkPolicy(deny=[host]):
                    hosts.append(host)
        return hosts
