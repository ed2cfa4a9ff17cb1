"""The policy file (``REPLGATE_POLICY_FILE``, TOML): rules, where they apply, budgets, profiles.

::

    [[rules]]                       # a rule of your own (built-ins are listed in BUILTIN_RULES)
    id = "no-rmtree"
    action = "deny"                 # or "approve": hold the code until a person decides
    calls = ["shutil.rmtree"]       # dotted globs, resolved through import aliases
    message = "deleting trees is not allowed"

    [defaults]
    rules = ["builtin.subprocess", "builtin.credentials", "no-rmtree"]

    [budgets]                       # per session; tenants' and profiles' tables override
    max_executions = 100

    [tenants.acme]
    rules = ["builtin.pip"]         # added to the defaults (union)

    [profiles.web]                  # a profile: Profile fields, egress_allow, rules, budgets
    egress_allow = ["pypi.internal:443"]

The file is read once at start-up; any problem stops the gateway with a message naming it.
No file: no rules, no budgets, only the default profile. See ``docs/policy.example.toml``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernel_pool import PoolSettings, Profile

__all__ = [
    "BUILTIN_RULES",
    "Budgets",
    "Policy",
    "PolicyError",
    "Rule",
    "load_policy",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_RULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
_MATCHERS = ("calls", "imports", "strings", "shell")


class PolicyError(ValueError):
    """The policy file is missing, not TOML, or not a valid policy; the message says where."""


Action = Literal["deny", "approve"]


@dataclass(frozen=True)
class Rule:
    """A rule, built in or from the file. Matchers are globs (``fnmatch``; ``*`` spans dots)."""

    id: str
    action: Action
    message: str
    calls: tuple[str, ...] = ()
    """Dotted names called or referenced (``os.system``, ``subprocess.*``)."""
    imports: tuple[str, ...] = ()
    """Modules imported (a pattern also matches submodules: ``ctypes`` covers ``ctypes.util``)."""
    strings: tuple[str, ...] = ()
    """String literals and shell command lines (case-insensitive)."""
    shell: tuple[str, ...] = ()
    """IPython shell lines: ``!cmd``, ``%pip ...``, ``%%bash`` bodies (case-insensitive)."""


_CREDENTIAL_PATHS = (
    "*/.ssh/*", "*/.ssh", ".ssh", "*id_rsa*", "*id_ecdsa*", "*id_ed25519*", "*.pem", "*.key",
    "*.p12", "*.pfx", "/etc/shadow", "/etc/gshadow", "*/.aws/*", ".aws", "*credentials*",
    "*/.netrc", ".netrc", "*/.docker/config.json", "*/.kube/config", "*/.git-credentials",
    "*/.pgpass", "*/.config/gcloud/*", "*/.azure/*",
)

BUILTIN_RULES: dict[str, Rule] = {rule.id: rule for rule in (
    Rule("builtin.shell", "deny", "shell commands (!cmd, %%bash, %system, %pip) are not allowed",
         shell=("*",), calls=("get_ipython().system", "get_ipython().getoutput")),
    Rule("builtin.subprocess", "deny",
         "starting processes (subprocess, os.system, os.exec*, pty) is not allowed",
         calls=("subprocess.*", "os.system", "os.popen", "os.spawn*", "os.exec*",
                "os.posix_spawn*", "os.fork", "os.forkpty", "posix.system", "posix.exec*",
                "posix.spawn*", "posix.posix_spawn*", "pty.spawn", "pty.fork",
                "asyncio.create_subprocess_*", "commands.*")),
    Rule("builtin.ctypes", "deny", "ctypes and other foreign-function interfaces are not allowed",
         imports=("ctypes", "_ctypes", "cffi"), calls=("ctypes.*", "_ctypes.*", "cffi.*")),
    Rule("builtin.socket", "deny", "raw sockets are not allowed; use HTTP(S) through the proxy",
         imports=("socket", "_socket"),
         calls=("socket.*", "_socket.*", "asyncio.open_connection", "asyncio.start_server",
                "asyncio.open_unix_connection", "asyncio.start_unix_server")),
    Rule("builtin.credentials", "deny", "reading credential-like paths is not allowed",
         strings=_CREDENTIAL_PATHS),
    Rule("builtin.pip", "approve", "installing packages needs a person's approval",
         shell=("*pip install*", "*pip3 install*", "conda install*", "mamba install*",
                "uv add*", "uv pip install*"),
         imports=("pip",), calls=("pip.main", "pip._internal.*")),
)}


# -- the file's shape -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budgets(_Strict):
    """Caps per session; absent (None) is unlimited, or inherited from the enclosing table."""

    max_executions: int | None = Field(None, ge=1, description="executions that ran")
    max_wall_time_s: float | None = Field(None, gt=0, description="their summed duration")
    max_cpu_time_s: float | None = Field(None, gt=0, description="their summed CPU time")
    max_lifetime_s: float | None = Field(None, gt=0, description="the session's age")

    def over(self, *others: Budgets) -> Budgets:
        """These defaults, overridden by ``others``' set fields (the smallest where several)."""
        merged = self.model_dump()
        for name in type(self).model_fields:
            values = [getattr(o, name) for o in others if getattr(o, name) is not None]
            if values:
                merged[name] = min(values)
        return Budgets(**merged)


class RuleSpec(_Strict):
    id: str
    action: Action | None = None
    extends: str | None = Field(None, description="a rule whose matchers this one starts from")
    calls: list[str] = Field(default_factory=list)
    imports: list[str] = Field(default_factory=list)
    strings: list[str] = Field(default_factory=list)
    shell: list[str] = Field(default_factory=list)
    message: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _RULE_ID.fullmatch(value):
            raise ValueError(f"rule id {value!r}: use letters, digits, '.', '_', ':' or '-'")
        if value.startswith("builtin."):
            raise ValueError(f"rule id {value!r}: ids starting 'builtin.' are reserved")
        return value

    @field_validator("calls", "imports", "strings", "shell")
    @classmethod
    def _globs(cls, value: list[str]) -> list[str]:
        if any(not pattern.strip() for pattern in value):
            raise ValueError("a pattern is empty")
        return value


class Scope(_Strict):
    rules: list[str] = Field(default_factory=list)
    budgets: Budgets = Field(default_factory=Budgets)


class ProfileSpec(Scope):
    """``[profiles.<name>]``: rules and budgets, and any Profile field (``egress_allow`` too)."""

    model_config = ConfigDict(extra="allow")


class PolicyFile(_Strict):
    rules: list[RuleSpec] = Field(default_factory=list)
    defaults: Scope = Field(default_factory=Scope)
    budgets: Budgets = Field(default_factory=Budgets)
    tenants: dict[str, Scope] = Field(default_factory=dict)
    profiles: dict[str, ProfileSpec] = Field(default_factory=dict)


# -- the loaded policy ------------------------------------------------------------------------


class Policy:
    """A validated policy: which rules and budgets apply to a tenant's session of a profile."""

    def __init__(self, spec: PolicyFile | None = None, source: str = "no policy file") -> None:
        self.spec = spec or PolicyFile()
        self.source = source
        self.rules: dict[str, Rule] = dict(BUILTIN_RULES)
        for rule in self.spec.rules:
            self.rules[rule.id] = _build_rule(rule, self.rules)

    def __repr__(self) -> str:
        return (f"<Policy {self.source}: {len(self.spec.rules)} rules of its own, "
                f"{len(self.spec.tenants)} tenants, {len(self.spec.profiles)} profiles>")

    @property
    def empty(self) -> bool:
        return self.spec == PolicyFile()

    def rules_for(self, tenant: str, profile: str) -> list[Rule]:
        """The defaults' rules, the tenant's and the profile's (union, in that order)."""
        ids = [*self.spec.defaults.rules]
        if tenant in self.spec.tenants:
            ids += self.spec.tenants[tenant].rules
        if profile in self.spec.profiles:
            ids += self.spec.profiles[profile].rules
        return [self.rules[rule_id] for rule_id in dict.fromkeys(ids)]

    def budgets_for(self, tenant: str, profile: str) -> Budgets:
        """``[budgets]``, overridden by the tenant's and the profile's (the smaller of both)."""
        others = []
        if tenant in self.spec.tenants:
            others.append(self.spec.tenants[tenant].budgets)
        if profile in self.spec.profiles:
            others.append(self.spec.profiles[profile].budgets)
        return self.spec.budgets.over(*others)

    def pool_settings(self, base: PoolSettings) -> PoolSettings:
        """``base`` with the file's profiles added (each built on ``base``'s default profile)."""
        default = base.profiles["default"]
        profiles = dict(base.profiles)
        for name, spec in self.spec.profiles.items():
            fields = dict(spec.model_extra or {})
            if fields:
                start = profiles.get(name, default)
                profiles[name] = Profile.model_validate(
                    {**start.model_dump(), **fields, "name": name})
            elif name not in profiles:
                profiles[name] = default.model_copy(update={"name": name})
        return base.model_copy(update={"profiles": profiles})

    def check(self) -> None:
        """The checks a schema cannot make; PolicyError naming the first problem."""
        ids = [rule.id for rule in self.spec.rules]
        for rule_id in ids:
            if ids.count(rule_id) > 1:
                raise PolicyError(f"rule {rule_id!r} is defined twice")
        scopes: list[tuple[str, Scope]] = [("defaults", self.spec.defaults)]
        for kind, table in (("tenants", self.spec.tenants), ("profiles", self.spec.profiles)):
            for name, scope in table.items():
                if not _NAME.fullmatch(name):
                    raise PolicyError(f"[{kind}.{name}]: {name!r} is not a valid name (letters, "
                                      "digits, '.', '_', '-'; at most 64)")
                scopes.append((f"{kind}.{name}", scope))
        for where, scope in scopes:
            for rule_id in scope.rules:
                if rule_id not in self.rules:
                    raise PolicyError(f"[{where}] rules: no rule {rule_id!r}; known: "
                                      f"{', '.join(sorted(self.rules))}")
        for name, spec in self.spec.profiles.items():
            fields = dict(spec.model_extra or {})
            unknown = set(fields) - (set(Profile.model_fields) - {"name"})
            if unknown:
                known = sorted({*Profile.model_fields, "rules", "budgets"} - {"name"})
                raise PolicyError(f"[profiles.{name}]: unknown setting(s) "
                                  f"{', '.join(sorted(unknown))}; known: {', '.join(known)}")
            for networked in ("egress_allow", "network_max"):
                if name == "default" and fields.get(networked):
                    raise PolicyError(f"[profiles.default]: {networked} is not allowed here; "
                                      "the default profile stays network-less. Define another "
                                      "profile")
            try:
                Profile.model_validate({**Profile().model_dump(), **fields, "name": name})
            except ValidationError as exc:
                raise PolicyError(f"[profiles.{name}]: {_describe(exc)}") from None


def _build_rule(spec: RuleSpec, known: dict[str, Rule]) -> Rule:
    base = None
    if spec.extends is not None:
        base = known.get(spec.extends)
        if base is None:
            raise PolicyError(f"rule {spec.id!r} extends {spec.extends!r}, which is not defined "
                              "(built-ins, or rules earlier in the file)")
    action = spec.action or (base.action if base else None)
    if action is None:
        raise PolicyError(f"rule {spec.id!r} needs an action: \"deny\" or \"approve\"")
    matchers: dict[str, Any] = {
        name: tuple(getattr(base, name) if base else ()) + tuple(getattr(spec, name))
        for name in _MATCHERS}
    if not any(matchers.values()):
        raise PolicyError(f"rule {spec.id!r} matches nothing: give it calls, imports, strings "
                          "or shell patterns (or extends)")
    message = spec.message or (base.message if base else f"rule {spec.id} matched")
    return Rule(id=spec.id, action=action, message=message, **matchers)


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(problems)


def load_policy(path: Path | None) -> Policy:
    """The policy in ``path`` (None: the empty policy). PolicyError says what is wrong."""
    if path is None:
        return Policy()
    where = f"policy file {path} (REPLGATE_POLICY_FILE)"
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{where}: not valid TOML: {exc}") from None
    try:
        spec = PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{where}: {_describe(exc)}") from None
    try:
        policy = Policy(spec, source=str(path))
        policy.check()
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    return policy
