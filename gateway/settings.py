"""Gateway settings, from ``REPLGATE_*`` environment variables. Every one has a default.

Nothing reads the environment at import time: ``Settings()`` does, when the CLI builds the app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernel_pool.config import (
    MAX_OUTPUT_BYTES_LIMIT,
    OutputCaps,
    PoolSettings,
    Profile,
    parse_size,
)
from kernel_pool.image import current_image


def default_state_dir() -> Path:
    return Path.home() / ".local" / "state" / "replgate"


class Settings(BaseSettings):
    """Configuration of ``replgate serve``; each field is ``REPLGATE_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="REPLGATE_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind; 127.0.0.1 keeps it local")
    port: int = Field(8000, ge=0, le=65535)
    state_dir: Path = Field(default_factory=default_state_dir,
                            description="SQLite database, audit log, keys, workspaces, sockets")
    api_keys: str | None = Field(None, description="tenant:key pairs, comma-separated")
    log_json: bool = Field(False, description="log as JSON lines")
    log_level: str = "info"

    # pool
    image: str = Field(default_factory=current_image,
                       description="sandbox image; default: the one built from this code")
    runtime: Literal["runc", "gvisor"] = Field(
        "runc", description="isolation of the default profile: runc or gvisor (runsc)")
    max_kernels: int = Field(8, ge=1, le=1024, description="kernels in all, warm and in use")
    min_idle: int = Field(1, ge=0, le=64, description="warm kernels kept ready")
    memory: str = Field("2g", description="memory limit per sandbox (no swap)")
    cpus: float = Field(1.0, gt=0, le=64, description="CPUs per sandbox")
    pids: int = Field(256, ge=16, le=32768, description="processes+threads per sandbox")
    tmp_size: str = "256m"
    workspace_size: str = Field("1g", description="size cap of each session's workspace")
    state_min_free: str = Field("256m", description="free disk the state directory must keep: "
                                "below it, new sessions and executions get 507")
    default_timeout_s: float = Field(60.0, gt=0)
    max_timeout_s: float = Field(3600.0, gt=0, description="largest timeout_s a request may ask")
    interrupt_grace_s: float = Field(2.0, gt=0)
    max_queued_executions: int = Field(16, ge=1)
    idle_ttl_s: float = Field(3600.0, gt=0, description="idle sessions are deleted after this")
    max_lifetime_s: float = Field(86400.0, gt=0)
    stream_chars: int = Field(20_000, ge=1000, description="stdout+stderr chars returned")
    max_output_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, le=MAX_OUTPUT_BYTES_LIMIT,
        description="bytes of one display's or result's bundle: a larger one is replaced, "
                    "inside the sandbox, by a notice and `omitted` sizes")
    owner: str = Field("replgate", description="container label naming this gateway")

    # requests
    max_code_bytes: int = Field(1_000_000, ge=1, description="largest code of one execution")
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1)
    max_download_bytes: int = Field(100 * 1024 * 1024, ge=1)
    max_sessions_per_tenant: int = Field(32, ge=1)
    max_concurrent_executions_per_tenant: int = Field(16, ge=1)
    allowed_origins: list[str] = Field(default_factory=list,
                                       description="browser origins allowed on WebSockets "
                                                   "besides the gateway's own")

    # governance (gateway/governance/)
    policy_file: Path | None = Field(None, description="TOML policy: rules, approvals, budgets, "
                                                       "profiles (docs/policy.example.toml)")
    approver_keys: str | None = Field(None, description="tenant:name:key triples, "
                                                        "comma-separated: people who approve")
    approval_timeout_s: float = Field(600.0, gt=0, description="a held execution expires after")

    @field_validator("memory", "tmp_size", "workspace_size", "state_min_free")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> Settings:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("REPLGATE_DEFAULT_TIMEOUT_S cannot exceed REPLGATE_MAX_TIMEOUT_S")
        return self

    @model_validator(mode="after")
    def _approver_keys(self) -> Settings:
        if not self.approver_keys:
            return self
        from gateway.auth import parse_api_keys_setting
        from gateway.governance.approvals import parse_approver_keys

        approvers = {key for _, key in parse_approver_keys(self.approver_keys)}
        agents = {k for keys in parse_api_keys_setting(self.api_keys or "").values() for k in keys}
        if approvers & agents:
            raise ValueError("a key is both in REPLGATE_API_KEYS and REPLGATE_APPROVER_KEYS; "
                             "give approvers keys of their own")
        return self

    @property
    def db_path(self) -> Path:
        return self.state_dir / "replgate.db"

    def pool_settings(self) -> PoolSettings:
        profile = Profile(
            name="default", image=self.image, runtime=self.runtime, memory=self.memory,
            cpus=self.cpus, pids=self.pids, tmp_size=self.tmp_size,
            workspace_size=self.workspace_size, min_idle=self.min_idle,
            default_timeout_s=self.default_timeout_s, max_timeout_s=self.max_timeout_s,
            caps=OutputCaps(
                stream_chars=self.stream_chars, display_bytes=self.max_output_bytes,
                display_total_bytes=max(2 * self.max_output_bytes,
                                        OutputCaps().display_total_bytes)))
        return PoolSettings(
            state_dir=self.state_dir, profiles={"default": profile},
            max_kernels=self.max_kernels, interrupt_grace_s=self.interrupt_grace_s,
            max_queued_executions=self.max_queued_executions, idle_ttl_s=self.idle_ttl_s,
            max_lifetime_s=self.max_lifetime_s, owner=self.owner)
