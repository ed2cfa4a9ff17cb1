"""Settings from the environment: nested names reach every pool setting, flat names still work."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from common.settings import FLAT_NAMES, Settings
from common.settings_load import SettingsError, load_settings
from kernel_pool import NetworkPolicy, OutputCaps, PoolLimits, Profile

SIZES = {"memory", "tmp_size", "workspace_size", "snapshot_budget", "memory_reserve"}


def other_value(model: type[BaseModel], name: str) -> tuple[str, Any]:
    """A valid value unlike the default: (as the environment writes it, as it is read)."""
    default = model.model_fields[name].get_default(call_default_factory=True)
    if name in SIZES:
        return "3g", "3g"
    annotation = model.model_fields[name].annotation
    if get_origin(annotation) is Literal:  # a choice: another one of it
        other = next(choice for choice in get_args(annotation) if choice != default)
        return str(other), other
    if isinstance(default, bool):
        return str(not default).lower(), not default
    if isinstance(default, int | float):
        return str(default + 1), type(default)(default + 1)
    if isinstance(default, list):
        return '["example.com"]', ["example.com"]
    if Path in get_args(annotation):  # a folder, unset by default
        return "/srv/other-value", Path("/srv/other-value")
    if NetworkPolicy in get_args(annotation):  # a profile's network bound, unset by default
        return '{"default": "allow"}', NetworkPolicy(default="allow")
    if int in get_args(annotation):  # a number unset by default (the machine's): min_idle
        return "3", 3
    return "other-value", "other-value"


def scalar_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, field in model.model_fields.items()
            if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel))
            and name != "name"]


def read(settings: Settings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return value


def test_defaults_are_the_pools_own() -> None:
    settings = Settings()
    assert settings.pool == PoolLimits()
    assert settings.limits == Profile()
    pool = settings.pool_settings()
    assert pool.max_kernels == PoolLimits().max_kernels
    assert pool.profiles["default"] == Profile()


@pytest.mark.parametrize(("group", "model", "prefix"), [
    (("pool",), PoolLimits, "REPLGATE_POOL__"),
    (("limits",), Profile, "REPLGATE_LIMITS__"),
    (("limits", "caps"), OutputCaps, "REPLGATE_LIMITS__CAPS__"),
])
def test_nested_names_reach_every_setting(monkeypatch: pytest.MonkeyPatch,
                                          group: tuple[str, ...], model: type[BaseModel],
                                          prefix: str) -> None:
    expected = {}
    for name in scalar_fields(model):
        text, value = other_value(model, name)
        monkeypatch.setenv(prefix + name.upper(), text)
        expected[name] = value
    if model is Profile:  # keep the default timeout within the maximum
        monkeypatch.setenv(prefix + "MAX_TIMEOUT_S", "7200")
        expected["max_timeout_s"] = 7200.0

    settings = Settings()

    got = {name: read(settings, (*group, name)) for name in expected}
    assert got == expected


@pytest.mark.parametrize("flat", sorted(FLAT_NAMES))
def test_flat_names_still_work(monkeypatch: pytest.MonkeyPatch, flat: str) -> None:
    *parents, name = FLAT_NAMES[flat]
    model = {("pool",): PoolLimits, ("limits",): Profile,
             ("limits", "caps"): OutputCaps}[tuple(parents)]
    text, value = other_value(model, name)
    if flat == "default_timeout_s":
        monkeypatch.setenv("REPLGATE_MAX_TIMEOUT_S", "7200")
    monkeypatch.setenv(f"REPLGATE_{flat.upper()}", text)

    assert read(Settings(), FLAT_NAMES[flat]) == value


def test_flat_names_reach_the_pool_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_MAX_KERNELS", "3")
    monkeypatch.setenv("REPLGATE_MEMORY", "1g")
    monkeypatch.setenv("REPLGATE_STREAM_CHARS", "5000")

    pool = Settings().pool_settings()

    assert pool.max_kernels == 3
    assert pool.profiles["default"].memory == "1g"
    assert pool.profiles["default"].caps.stream_chars == 5000


def test_nested_name_wins_over_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_MEMORY", "1g")
    monkeypatch.setenv("REPLGATE_LIMITS__MEMORY", "3g")

    assert Settings().limits.memory == "3g"


def test_flat_keyword_arguments_are_nested() -> None:
    assert Settings(memory="1g", max_kernels=2).limits.memory == "1g"


@pytest.mark.parametrize(("name", "value"), [
    ("REPLGATE_LIMITS__MEMORY", "lots"),
    ("REPLGATE_POOL__MAX_KERNELS", "0"),
    ("REPLGATE_LIMITS__CAPS__STREAM_CHARS", "10"),
    ("REPLGATE_DEFAULT_TIMEOUT_S", "9000"),
])
def test_unsafe_value_is_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_raised_output_cap_raises_the_total_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLGATE_MAX_OUTPUT_BYTES", str(32 * 2**20))

    caps = Settings().pool_settings().profiles["default"].caps

    assert (caps.display_bytes, caps.display_total_bytes) == (32 * 2**20, 64 * 2**20)
    assert OutputCaps().display_total_bytes == 16 * 2**20


@pytest.mark.parametrize(("variables", "line"), [
    ({"REPLGATE_MEMORY": "lots"}, "REPLGATE_MEMORY='lots': 'lots' is not a size"),
    ({"REPLGATE_LIMITS__MEMORY": "lots"}, "REPLGATE_LIMITS__MEMORY='lots': 'lots' is not a size"),
    ({"REPLGATE_PAUSE_WITH": "disk"},
     "REPLGATE_PAUSE_WITH='disk': should be 'auto', 'variables' or 'memory'"),
    ({"REPLGATE_RUNTIME": "kata", "REPLGATE_PORT": "x"}, "REPLGATE_PORT='x': should be a valid "
     "integer, unable to parse string as an integer; REPLGATE_RUNTIME='kata': should be"),
    ({"REPLGATE_DATABASE_URL": "mysql://me:hunter2@db/x"},
     "REPLGATE_DATABASE_URL must be postgresql://"),
    ({"REPLGATE_DATABASE_URL": "postgresql://me:hunter2@db:port/x"},
     "REPLGATE_DATABASE_URL is not a database URL"),
    ({"REPLGATE_BUNDLE_STORE": "/srv/bundles"}, "REPLGATE_BUNDLE_STORE must be s3://bucket/"),
    ({"REPLGATE_BUNDLE_KEY": "aHVudGVyMg=="}, "REPLGATE_BUNDLE_KEY must hold at least 32"),
    ({"REPLGATE_ALLOWED_ORIGINS": "x"}, "REPLGATE_ALLOWED_ORIGINS (or a"),
    ({"REPLGATE_LOG_LEVEL": "loud"}, "REPLGATE_LOG_LEVEL='loud': must be one of debug"),
])
def test_what_cannot_work_is_one_line_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], line: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(SettingsError) as refused:
        load_settings()

    said = str(refused.value)
    assert line in said and "\n" not in said
    assert "hunter2" not in said and "aHVudGVyMg" not in said  # secrets are not repeated


@pytest.mark.parametrize(("url", "local"), [
    (None, True), ("sqlite:////srv/replgate/state.db", True),
    ("postgresql://replgate:secret@db:5432/replgate", False)])
def test_sessions_run_here_unless_the_database_is_shared(url: str | None, local: bool) -> None:
    assert Settings(database_url=url).hosts_sessions is local
    assert Settings(database_url=url, local_node=not local).hosts_sessions is not local


def test_the_database_and_bundle_store_hosts_are_guarded(monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://store.internal:8333")
    settings = Settings(database_url="postgresql://u:p@db.internal:5432/x",
                        bundle_store="s3://bucket/prefix", bundle_key="A" * 44,
                        pool={"egress_guarded": ["10.9.0.0/16"]})
    assert settings.pool_settings().egress_guarded == ["10.9.0.0/16", "db.internal",
                                                       "store.internal"]
