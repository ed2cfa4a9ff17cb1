"""The control plane's wire (E2B's OpenAPI: NewSandbox, Sandbox, SandboxDetail, ListedSandbox).

Field names are E2B's (``templateID``, ``sandboxID``, camelCase); requests ignore fields this
version does not know, as E2B's API does. What an SDK sends unasked (``allow_internet_access:
true``, ``secure``, ``autoPause: false``) gets the sandbox its profile gives, and the answer says
what that is (:class:`SandboxNetwork`); the asks replgate cannot honour are refused by
:mod:`gateway.e2b._control` with a sentence. What a create asks of the sandbox's end
(``autoPause``, ``autoPauseMemory``, ``autoResume``) is :mod:`gateway.e2b._lifecycle`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

ENVD_VERSION = "0.6.4"
"""The envd version replgate answers as: octet-stream uploads (0.5.7), the default user
(0.4.0), file metadata (0.6.2), watch entries (0.6.3) and the network-mounts flag of a watch
(0.6.4) are served."""

DEFAULT_TEMPLATES = frozenset({"base", "code-interpreter-v1", "code-interpreter"})
"""The SDKs' default template names; they run on replgate's ``default`` profile."""


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NetworkRequest(Lenient):
    """``SandboxNetworkConfig`` as a create asks for it (E2B's ``network``)."""

    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")
    """Whether the sandbox's URLs may be reached without its traffic token: on replgate the
    token is always needed, so the answer says ``false`` whatever was asked."""
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    """Both mapped onto the session's network policy (:mod:`gateway.e2b._network`)."""
    rules: dict[str, Any] = Field(default_factory=dict)
    """Everything else the create asked for (``maskRequestHost``, ``rules``, ...), which
    replgate does not map; empty values count as unset."""

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        mapped = {"allowPublicTraffic", "allow_public_traffic", "allowOut", "allow_out",
                  "denyOut", "deny_out"}
        return {**{k: v for k, v in data.items() if k in mapped},
                "rules": {k: v for k, v in data.items() if k not in mapped
                          and v not in (None, [], {}, "")}}


class AutoResumeRequest(Lenient):
    """``SandboxAutoResumeConfig``: whether traffic to the sandbox resumes it once paused."""

    enabled: bool


class NewSandbox(Lenient):
    template_id: str = Field(alias="templateID", min_length=1, max_length=128)
    timeout: int | None = Field(None, ge=0, description="seconds the sandbox lives")
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars")
    auto_pause: bool | None = Field(None, alias="autoPause")
    """At its timeout the sandbox is paused instead of killed (E2B's default: killed)."""
    auto_pause_memory: bool | None = Field(None, alias="autoPauseMemory")
    """``false``: that pause keeps the files only, and its resume boots a fresh kernel."""
    auto_resume: AutoResumeRequest | None = Field(None, alias="autoResume")
    allow_internet_access: bool | None = None
    """Older SDKs (Python's 2.45.1 and JS's 2.45.0 among them) send ``true`` on every create
    unless told otherwise, so ``true`` is E2B's default ask: the internet where the profile
    lets a session open it, else the profile's network, and the answer says which
    (:mod:`gateway.e2b._network`)."""
    network: NetworkRequest | None = None
    mcp: dict[str, Any] | None = None
    """Read by no one: E2B's SDKs start the MCP gateway inside the sandbox themselves, after
    the create (replgate's images have none, so that start fails, as in E2B's ``base``)."""
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")


class TimeoutRequest(Lenient):
    timeout: int = Field(ge=0, description="seconds from now")


class ConnectRequest(Lenient):
    """``ConnectSandboxV2``; ``ResumedSandbox`` of the deprecated ``/resume`` too."""

    timeout: int | None = Field(None, ge=0)
    memory: bool = Field(True, description="false: a paused sandbox restarts from its files")


class PauseRequest(Lenient):
    """``SandboxPauseRequest``: ``memory: false`` keeps the files only."""

    memory: bool = True


class ForkSandbox(Lenient):
    """``SandboxForkRequest``."""

    timeout: int = Field(15, ge=0, description="seconds the forks live (E2B's default: 15)")
    count: int = Field(1, ge=1, le=20)


class SandboxNetwork(BaseModel):
    """``SandboxNetworkConfig`` as replgate answers it: the network the sandbox has."""

    allowPublicTraffic: bool = False
    """Always false: every in-sandbox request needs the sandbox's access token."""
    allowOut: list[str] = Field(default_factory=list)
    """The session's policy's allow entries, else its profile's ``egress_allow`` (through the
    gateway's filtering proxy)."""
    denyOut: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])
    """Its deny entries, with everything else (``0.0.0.0/0``) when its default is deny."""
    rules: dict[str, list[dict[str, Any]]] | None = None
    """Its header rules in E2B's shape (host: ``[{"transform": {"headers": ...}}]``, secrets as
    ``${e2b.secrets.NAME}`` placeholders, never a value); left out when it has none."""

    @model_serializer(mode="wrap")
    def _rules_when_some(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("rules"):
            data.pop("rules", None)
        return data


class SandboxLifecycle(BaseModel):
    """``SandboxLifecycle``: what the sandbox's timeout does, and whether traffic resumes it
    when paused (what its create asked; E2B's defaults: killed, not resumed)."""

    onTimeout: Literal["kill", "pause"] = "kill"
    autoResume: bool = False


class SandboxOut(BaseModel):
    """``Sandbox``: what create and connect answer."""

    templateID: str
    sandboxID: str
    clientID: str = "replgate"
    alias: str | None = None
    envdVersion: str = ENVD_VERSION
    envdAccessToken: str
    trafficAccessToken: str
    """The same per-sandbox secret: the code interpreter SDKs send this header (and not
    ``X-Access-Token``) on their context calls."""
    domain: str | None = None
    allowInternetAccess: bool = False
    """E2B's create answer has no such field (its ``SandboxDetail`` has): replgate adds it, and
    ``network``, so that a create which asked for the internet reads what it got."""
    network: SandboxNetwork = Field(default_factory=SandboxNetwork)


class ListedSandbox(BaseModel):
    templateID: str
    sandboxID: str
    clientID: str = "replgate"
    alias: str | None = None
    startedAt: str
    endAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: Literal["running", "paused"]
    envdVersion: str = ENVD_VERSION
    metadata: dict[str, Any] = Field(default_factory=dict)


class SandboxDetail(ListedSandbox):
    envdAccessToken: str
    allowInternetAccess: bool = False
    """Whether the sandbox's policy is open by default (``network`` says what it reaches)."""
    domain: str | None = None
    network: SandboxNetwork = Field(default_factory=SandboxNetwork)
    lifecycle: SandboxLifecycle = Field(default_factory=SandboxLifecycle)


class ForkResult(BaseModel):
    """``SandboxForkResult``: one fork. (E2B's has ``error`` instead for a fork that could not
    start; replgate forks all or none, so a failure is the whole request's.)"""

    sandbox: SandboxOut
