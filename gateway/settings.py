"""Gateway settings, from ``REPLGATE_*`` environment variables (placeholder, extended below)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REPLGATE_")

    state_dir: Path = Path(".state")
