"""A session's secret rules: which HTTPS requests get which headers, and whose placeholders the
egress broker (:mod:`kernel_pool._broker`) replaces with the secrets' values.

A rule matches a request by host (exact name, ``*.`` wildcard or IP literal), port (443 unless
given), method (any unless listed) and path (any unless listed; ``*`` patterns over the path
without its query). Its ``headers`` are set on the matching request, each ``{secret:NAME}`` in
them replaced by the secret's value; and the placeholders the sandbox holds (a session's
environment value ``{secret:NAME}``) are replaced in the matching request's headers, for the
secrets the rule names (in its headers or its ``secrets`` list) and no others: a secret goes
only to the hosts its rules name.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernel_pool._allowlist import parse_allow

__all__ = ["PLACEHOLDER", "SecretRule", "check_rules", "matching_rules", "secret_names"]

PLACEHOLDER = re.compile(r"\{secret:([A-Za-z0-9_][A-Za-z0-9_.-]{0,63})\}")
"""``{secret:NAME}``: in a rule's header value, and as the sandbox's stand-in for a secret."""
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class SecretRule(BaseModel):
    """One rule: requests it matches, headers it sets, secrets whose placeholders it fills."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="api.example.com, *.example.com or an IP address")
    port: int = Field(443, ge=1, le=65535)
    methods: list[str] = Field(default_factory=list, description="e.g. [\"POST\"]; empty: any")
    paths: list[str] = Field(default_factory=list, description="e.g. [\"/v1/*\"]; empty: any")
    headers: dict[str, str] = Field(default_factory=dict,
                                    description="set on matching requests; values may hold "
                                                "{secret:NAME}")
    secrets: list[str] = Field(default_factory=list,
                               description="secrets whose placeholders are replaced in "
                                           "matching requests (besides those in headers)")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        entry = parse_allow([value])[0]
        if entry.port is not None:
            raise ValueError(f"rule host {value!r}: give the port as \"port\", not in the host")
        return entry.host

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: list[str]) -> list[str]:
        for method in value:
            if not _TOKEN.fullmatch(method):
                raise ValueError(f"rule method {method[:40]!r} is not an HTTP method")
        return [method.upper() for method in value]

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"rule path {path[:80]!r} must start with '/'")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"rule header name {name[:40]!r} is not a header name")
            if any(ord(char) < 0x20 or ord(char) > 0xFF for char in text):
                raise ValueError(f"rule header {name!r}: its value holds control or "
                                 "non-Latin-1 characters")
        return value

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: list[str]) -> list[str]:
        for name in value:
            if not PLACEHOLDER.fullmatch(f"{{secret:{name}}}"):
                raise ValueError(f"rule secret {name[:70]!r} is not a secret name")
        return value

    def covers(self, host: str, port: int) -> bool:
        """Whether requests to ``host:port`` may match (then HTTPS to it is terminated)."""
        if port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def matches(self, host: str, port: int, method: str, path: str) -> bool:
        """Whether the request is this rule's."""
        if not self.covers(host, port):
            return False
        if self.methods and method.upper() not in self.methods:
            return False
        bare = path.split("?", 1)[0]
        return not self.paths or any(fnmatch.fnmatchcase(bare, p) for p in self.paths)

    def named(self) -> set[str]:
        """The secrets this rule may put into a request."""
        names = set(self.secrets)
        for text in self.headers.values():
            names.update(PLACEHOLDER.findall(text))
        return names


def matching_rules(rules: Sequence[SecretRule], host: str, port: int, method: str,
                   path: str) -> list[SecretRule]:
    """The rules a request matches, in order."""
    return [rule for rule in rules if rule.matches(host, port, method, path)]


def secret_names(rules: Sequence[SecretRule]) -> set[str]:
    """Every secret the rules may put into a request."""
    return {name for rule in rules for name in rule.named()}


def check_rules(default: str, rules: Sequence[SecretRule]) -> None:
    """ValueError (a 422) for rules on a policy whose default is ``allow``: a sandbox that may
    reach any host could send a secret anywhere (to a host of its own, through a rule's
    placeholder), so secrets are brokered only where the hosts are listed."""
    if rules and default == "allow":
        raise ValueError("secret rules need a network policy whose default is \"deny\": with "
                         "\"allow\" the sandbox could send a secret to any host")
