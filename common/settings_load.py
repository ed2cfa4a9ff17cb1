"""Loading :class:`~common.settings.Settings` for a command: what pydantic finds wrong said in
one line naming each environment variable to change, never a traceback nor a secret's value."""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import ValidationError
from pydantic_settings.exceptions import SettingsError as SourceError

from common.settings import ENV_PREFIX, FLAT_NAMES, Settings


class SettingsError(ValueError):
    """Settings that cannot work, said in one line naming each variable to change."""


_SECRETS = {"api_keys", "admin_keys", "approver_keys", "bundle_key", "database_url",
            "secrets_key"}
"""Settings whose values are never repeated in a message (keys, a password in a URL)."""


def _variable(location: tuple[int | str, ...]) -> str:
    """The environment variable of a setting's place in :class:`Settings`: the flat name
    where one is set, else the nested one."""
    path = tuple(str(part) for part in location)
    environ = {key.upper() for key in os.environ}
    for flat, nested in FLAT_NAMES.items():
        name = ENV_PREFIX + flat.upper()
        if nested == path and name in environ:
            return name
    return ENV_PREFIX + "__".join(path).upper()


def settings_error(exc: ValidationError) -> SettingsError:
    """One line for what pydantic found wrong: each setting's variable, its value (unless
    secret) and what it should be."""
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ").removeprefix("Input ")
        location = error["loc"]
        if not location or message.startswith(ENV_PREFIX):  # the message names its settings
            problems.append(message)
            continue
        name = _variable(location)
        shown = "" if str(location[-1]) in _SECRETS or location[0] in _SECRETS else (
            f"={error['input']!r}" if isinstance(error["input"], str | int | float) else "")
        problems.append(f"{name}{shown}: {message}")
    return SettingsError("; ".join(problems))


def load_settings(**overrides: Any) -> Settings:
    """:class:`Settings` from the environment and ``overrides``, or :class:`SettingsError`."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise settings_error(exc) from None
    except SourceError as exc:  # a list or a model that is not JSON: only its field is told
        field = re.search(r'field "(\w+)"', str(exc))
        name = ENV_PREFIX + (field.group(1).upper() if field else "...")
        raise SettingsError(f"{name} (or a {name}__... setting) is not valid JSON: "
                            f"{exc.__cause__ or exc}") from None

