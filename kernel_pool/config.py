"""Profiles (image plus limits) and pool settings: plain pydantic models with safe defaults.

Each default is stated here once; the gateway's settings nest these models (so every one of
them is reachable from the environment) instead of restating them. No container engine is
imported: the image is named by a hash of ``sandbox_image/``.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from kernel_pool._host_memory import machine_memory
from kernel_pool._network import NetworkPolicy
from kernel_pool._sandbox_image import current_image, named_image

MAX_OUTPUT_BYTES_LIMIT = 48 * 1024 * 1024
"""The largest per-output cap: a bundle base64-encodes and travels as one message, which must
stay under the host's message size limit (64 MiB) with room for its envelope."""


class OutputCaps(BaseModel):
    """What one execution may return; the rest is kept in a file in the workspace."""

    stream_chars: int = Field(20_000, ge=1_000, description="stdout+stderr characters returned")
    line_chars: int = Field(5_000, ge=100, description="characters of one line returned")
    display_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, le=MAX_OUTPUT_BYTES_LIMIT,
        description="one display's or result's bundle; over it, a notice and `omitted` "
        "(applied in the kernel, then again on the host)")
    display_count: int = Field(50, ge=1, description="display/result outputs per execution")
    display_total_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="payload of all rich outputs of one execution "
        "(displays, updates, clears) together; what the gateway holds and stores for it; "
        "unless given, at least two outputs of display_bytes")

    @model_validator(mode="before")
    @classmethod
    def _total_fits_two_outputs(cls, data: Any) -> Any:
        # A raised per-output cap raises the total with it, so one capped image still fits.
        if isinstance(data, dict) and "display_bytes" in data \
                and "display_total_bytes" not in data:
            default = cls.model_fields["display_total_bytes"].default
            data = {**data, "display_total_bytes": max(2 * int(data["display_bytes"]), default)}
        return data


class Profile(BaseModel):
    """A kind of sandbox: its image and the limits every container of it runs under."""

    name: str = "default"
    image: str = Field(default_factory=current_image,
                       description="sandbox image; default: the one built from this code, "
                       "with every language (`default`, or `polyglot` as it was once called, "
                       "names it too); `slim`: the one with Python and bash only "
                       "(`replgate image build --slim`); any other: an image of your own")
    runtime: Literal["runc", "gvisor"] = Field(
        "runc", description="isolation: runc (containers share the host's Linux kernel) or "
        "gvisor (runsc: each sandbox gets a user-space kernel of its own)")
    memory: str = Field("2g", description="memory limit; swap is not allowed on top of it")
    cpus: float = Field(1.0, gt=0, le=64)
    pids: int = Field(256, ge=16, le=32768, description="processes and threads")
    nofile: int = Field(1024, ge=64, le=65536, description="open files per process")
    tmp_size: str = Field("256m", description="size of the tmpfs mounted at /tmp")
    workspace_size: str = Field("1g", description="size cap of the session's workspace")
    huge_pages: bool = Field(
        False, description="let the kernels use transparent huge pages where they ask for "
        "them (numpy does, for large arrays), as the host's setting allows. Off: 4 KiB pages, "
        "so a memory resume and a start from a kernel template fill small pages; on a VM "
        "whose kernel reports free memory to its host (free page reporting), a fresh huge "
        "page can cost several times a small one (docs/checkpoint.md)")
    min_idle: int | None = Field(
        None, ge=0, le=256, description="warm kernels kept ready, frozen while they wait "
        "(no CPU; thawed in about a millisecond when a session takes one); unset: the "
        "machine's, see default_min_idle (shared among the profiles that leave it unset)")
    default_timeout_s: float = Field(60.0, gt=0)
    max_timeout_s: float = Field(3600.0, gt=0)
    caps: OutputCaps = Field(default_factory=OutputCaps)
    egress_allow: list[str] = Field(
        default_factory=list, description="hosts the sandbox may reach through the gateway's "
        "filtering proxy (host, *.suffix or IP, optional :port); empty: no network at all")
    network_max: NetworkPolicy | None = Field(
        None, description="the widest network policy a session of this profile may ask for "
        "(kernel_pool._network); unset: the egress_allow hosts, which a session may narrow")
    start_cmd: str | None = Field(
        None, description="a command each kernel's sandbox starts before the kernel answers "
        "(a custom template's, E2B's set_start_cmd): as the sandbox's user, in a session of "
        "its own, spared when what an execution left behind is killed; a kernel template is "
        "checkpointed with it running")
    ready_cmd: str | None = Field(
        None, description="run after start_cmd until it exits 0 (each try once the last "
        "ended); the kernel answers only then, and its start fails with both commands' "
        "output if it never does within ready_timeout_s")
    ready_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="how long ready_cmd has to exit 0 (the kernel's "
        "start may take this long on top of kernel_start_timeout_s)")

    @field_validator("memory", "tmp_size", "workspace_size")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return named_image(value)

    @field_validator("egress_allow")
    @classmethod
    def _egress(cls, value: list[str]) -> list[str]:
        from kernel_pool._allowlist import parse_allow

        parse_allow(value)
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> Profile:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError(f"default_timeout_s ({self.default_timeout_s:g}) cannot exceed "
                             f"max_timeout_s ({self.max_timeout_s:g})")
        return self

    def start_timeout(self, kernel_start_timeout_s: float) -> float:
        """How long a kernel of this profile may take to answer first: the pool's
        ``kernel_start_timeout_s``, and ``ready_timeout_s`` more when it has a service."""
        service = bool(self.start_cmd or self.ready_cmd)
        return kernel_start_timeout_s + (self.ready_timeout_s if service else 0.0)

    def timeout_for(self, timeout_s: float | None) -> float:
        """The timeout an execution asking for ``timeout_s`` gets (None: the default), or
        InvalidRequest naming the profile's range."""
        from kernel_pool.exceptions import InvalidRequest

        value = self.default_timeout_s if timeout_s is None else float(timeout_s)
        if not 0 < value <= self.max_timeout_s:
            raise InvalidRequest(
                f"timeout_s must be above 0 and at most {self.max_timeout_s:g} "
                f"(profile {self.name!r}); got {timeout_s}")
        return value


class PoolLimits(BaseModel):
    """How the pool runs: its caps and clocks (the gateway's ``REPLGATE_POOL__*``)."""

    max_kernels: int = Field(
        default_factory=lambda: default_max_kernels(), ge=1, le=1024,
        description="running kernels of all profiles, warm and in use (default: from the "
        "machine's memory, see default_max_kernels); past it the least recently used idle "
        "session is paused")
    memory_reserve: str | None = Field(
        None, description="memory the host keeps available (its MemAvailable, less 128 MiB for "
        "each kernel starting): below it no kernel starts and no paused session resumes until "
        "the least recently used idle session is paused to make room, as at max_kernels. "
        "Default: a tenth of the machine's memory, at least 512 MiB (see "
        "default_memory_reserve)")
    kernel_start_timeout_s: float = Field(
        60.0, gt=0, description="how long a launched kernel has to answer; one that does not "
        "is tried once more in a fresh sandbox before the request fails")
    capacity_wait_s: float = Field(
        30.0, ge=0, description="how long a new session's request for a kernel (or a paused "
        "session's, to resume) waits, with "
        "max_kernels running and none idle long enough to be paused, for a session to go idle "
        "or end (a burst of creates: the sessions made before it are still at their first "
        "execution); past it the request is refused (429, naming REPLGATE_MAX_KERNELS). Half "
        "the 60 s replgate's client and E2B's SDK wait for an answer: the other half is for "
        "the kernel's start once there is room, so a client hears the 429 rather than its "
        "own timeout")
    interrupt_grace_s: float = Field(2.0, gt=0, description="wait after an interrupt before a kill")
    max_queued_executions: int = Field(16, ge=1)
    max_commands: int = Field(4, ge=1, description="shell commands running at once per session")
    max_watches: int = Field(8, ge=1, le=256,
                             description="folders watched at once per session (watch_dir)")
    idle_ttl_s: float = Field(3600.0, gt=0, description="a session idle this long is culled")
    max_lifetime_s: float = Field(24 * 3600.0, gt=0)
    cull_interval_s: float = Field(30.0, gt=0)
    owner: str = Field("replgate", description="label value naming this gateway's containers")
    pause_after_s: float = Field(
        600.0, ge=0, description="an idle session is paused after this long (0: never)")
    snapshot_budget: str = Field("20g", description="disk all paused sessions' snapshots may take")
    pause_with: Literal["auto", "variables", "memory"] = Field(
        "auto", description="what a pause keeps: `variables` (a dill snapshot); `memory`, the "
        "whole sandbox's memory as well (a CRIU checkpoint through the engine; needs Docker's "
        "experimental mode and CRIU >= 4.2 on its host; a runc profile); `auto`, the variables "
        "when they are all the session holds, the memory when the variables snapshot would lose "
        "something (a value it cannot pickle, a running thread, a file in /tmp) and the host "
        "can checkpoint")

    kernel_templates: bool = Field(
        True, description="start a new sandbox's kernel by restoring a template (a kernel "
        "booted once, its imports done, checkpointed with CRIU) instead of booting it: "
        "0.15-0.2 s instead of about a second; where the host cannot (no root, not the CRIU "
        "./run.sh installs, gVisor, egress), kernels boot")
    template_dir: Path | None = Field(
        None, description="where kernel templates are kept (one per profile and image, about "
        "90 MB each); default: <state dir>/templates. Gateways of one host may share one")
    egress_ca_file: Path | None = Field(
        None, description="PEM certificates the egress broker trusts, besides the system's, "
        "for the hosts it connects to on a sandbox's behalf (a private API behind an "
        "internal CA; docs/secrets.md)")
    egress_guarded: list[str] = Field(
        default_factory=list, description="the cluster's own addresses, which no session's "
        "network policy reaches (IPs, CIDR networks, host names resolved at the start): say, "
        "the nodes' subnet. The host's own addresses, metadata, loopback and link-local ones "
        "are guarded always, and so are the database's and the bundle store's hosts")

    @field_validator("snapshot_budget")
    @classmethod
    def _budget(cls, value: str) -> str:
        parse_size(value)
        return value

    @field_validator("memory_reserve")
    @classmethod
    def _reserve(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    def memory_reserve_bytes(self) -> int:
        """:attr:`memory_reserve` in bytes, its default resolved."""
        if self.memory_reserve is None:
            return default_memory_reserve()
        return parse_size(self.memory_reserve)

    @field_validator("egress_guarded")
    @classmethod
    def _guarded(cls, value: list[str]) -> list[str]:
        from kernel_pool._network import parse_entry

        for entry in value:
            parse_entry(entry)
        return value


class PoolSettings(PoolLimits):
    """Everything a :class:`~kernel_pool.KernelPool` needs: where it keeps state, its
    profiles, and its :class:`PoolLimits`."""

    state_dir: Path
    profiles: dict[str, Profile] = Field(default_factory=lambda: {"default": Profile()})
    keep_sessions_on_close: bool = Field(
        False, description="close() leaves sessions' kernels running (and paused sessions on "
        "disk) for the next pool on the same state directory to take back")


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


class BundleSettings(BaseModel):
    """Where paused sessions are kept for any node to resume (``docs/bundles.md``)."""

    store: str | None = Field(
        None, description="s3://bucket/prefix (credentials, region and endpoint from the AWS_* "
        "variables; AWS_ENDPOINT_URL for an S3-compatible server) or file:///path (a file system "
        "the nodes share); unset: paused sessions stay in the state directory")
    key: SecretStr | None = Field(
        None, description="master key, base64 of 32 or more random bytes: each tenant's bundles "
        "are encrypted with a key derived from it; required for s3://, optional for file://")

    @model_validator(mode="after")
    def _check(self) -> BundleSettings:
        if self.store is not None:
            check_bundle_store(self.store, self.key)
        return self


def check_bundle_store(store: str, key: SecretStr | None, *, need_key: bool = True) -> None:
    """ValueError, naming the setting, for a bundle store URL or key that cannot work;
    ``need_key``: whether this process seals bundles (a gateway whose sessions run on nodes
    only names the store, and holds no key).

    Checked by the same functions the stores use, without their libraries (obstore,
    cryptography): settings are read where no bundle is ever opened."""
    store_folder(store)
    if key is not None:
        decode_bundle_key(key.get_secret_value())
    elif need_key and store.startswith("s3://"):
        raise ValueError("REPLGATE_BUNDLE_STORE is s3:// but REPLGATE_BUNDLE_KEY is unset: "
                         "bundles hold sessions' memory and are encrypted at rest; make a "
                         "key with: python -c 'import base64, os; "
                         "print(base64.b64encode(os.urandom(32)).decode())'")


BUNDLE_KEY_MIN_BYTES = 32


def store_folder(url: str) -> Path | None:
    """The folder a ``file:///path`` bundle store URL names, ``None`` for an
    ``s3://bucket/prefix`` one; ValueError for any other."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"REPLGATE_BUNDLE_STORE must be s3://bucket/prefix, not {url!r}")
        return None
    if parts.scheme == "file" and parts.netloc in {"", "localhost"} and parts.path.startswith("/"):
        return Path(unquote(parts.path))
    raise ValueError(f"REPLGATE_BUNDLE_STORE must be s3://bucket/prefix or file:///path, "
                     f"not {url!r}")


def decode_bundle_key(value: str) -> bytes:
    """The master key ``REPLGATE_BUNDLE_KEY`` holds (32 or more random bytes, base64), or
    ValueError saying how to make one."""
    try:
        master = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("REPLGATE_BUNDLE_KEY is not base64 (make one with: python -c "
                         "'import base64, os; print(base64.b64encode(os.urandom(32))"
                         ".decode())')") from exc
    check_bundle_key(master)
    return master


def check_bundle_key(master: bytes) -> None:
    """ValueError if ``master`` is too short to be a bundle master key."""
    if len(master) < BUNDLE_KEY_MIN_BYTES:
        raise ValueError(f"REPLGATE_BUNDLE_KEY must hold at least {BUNDLE_KEY_MIN_BYTES} "
                         f"bytes, not {len(master)} (make one with: python -c 'import base64, "
                         "os; print(base64.b64encode(os.urandom(32)).decode())')")


KERNEL_SLOT_BYTES = 128 * 1024**2
"""What :func:`default_max_kernels` counts a running kernel at: an idle one with the data stack
imported takes 93-96 MiB of the host's memory (its container's cgroup, and the fall of the
host's MemAvailable per session, thirty sessions after ``1+1``), and 128 MiB leaves it a third
more for its first work. Sessions that grow past it are the memory reserve's business."""


def default_max_kernels(memory_bytes: int | None = None) -> int:
    """Running kernels this machine holds: one per :data:`KERNEL_SLOT_BYTES` of 80% of its
    memory, 2 to 256 (153 on 24 GiB).

    The count bounds the idle kernels; working ones take more, and the host's available memory
    is kept above :func:`default_memory_reserve` by pausing idle sessions before a start. The
    rest of the sessions wait paused on disk (see ``REPLGATE_PAUSE_AFTER_S``).
    """
    if memory_bytes is None:
        memory_bytes = machine_memory()
    return max(2, min(256, int(memory_bytes * 0.8) // KERNEL_SLOT_BYTES))


def default_memory_reserve(memory_bytes: int | None = None) -> int:
    """The host memory kept available by default: a tenth of it, at least 512 MiB (the
    engine, the gateway and the page cache of the snapshots it writes and reads)."""
    if memory_bytes is None:
        memory_bytes = machine_memory()
    return max(512 * 1024**2, memory_bytes // 10)


WARM_PER_CORE = 10
"""Warm kernels per core a default install keeps: a claimed one answers its first execution
after about 25 ms of the host's CPU (thaw, session record, ``1+1``), so two cores hand out
about twenty within half a second; a burst beyond that waits for kernel restores anyway."""


def default_min_idle(max_kernels: int, cpus: int | None = None) -> int:
    """The warm kernels a default install keeps: :data:`WARM_PER_CORE` per core, at most two
    thirds of ``max_kernels`` (the rest is for sessions; a session needing room at the limit
    takes a warm kernel's slot anyway), at least one."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(WARM_PER_CORE * cpus, max_kernels * 2 // 3))


def parse_size(value: str) -> int:
    """``'512m'`` -> bytes; raises ValueError with the accepted forms."""
    text = value.strip().lower().removesuffix("ib").removesuffix("b") or "0"
    unit = text[-1] if text[-1] in _UNITS else ""
    number = text[: -1] if unit else text
    try:
        size = int(float(number) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"{value!r} is not a size; use e.g. 512m or 2g") from None
    if size <= 0:
        raise ValueError(f"{value!r} must be positive")
    return size
