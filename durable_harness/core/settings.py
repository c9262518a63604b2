"""Configuration: flags over ``DURABLE_HARNESS_*`` environment variables over defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from durable_harness.core.errors import ConfigError

ENV_PREFIX = "DURABLE_HARNESS_"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "durable-harness"


class Settings(BaseModel):
    """Every knob, with its environment variable ``DURABLE_HARNESS_<NAME upper>``."""

    world: str = "local"
    data_dir: Path = default_data_dir()
    lease_seconds: float = 30.0
    max_attempts: int = 5
    poll_seconds: float = 0.5
    model: str = "claude-sonnet-4-5"
    max_tokens: int = 4096
    max_model_calls: int = 50
    max_files: int = 500
    max_bytes: int = 10 * 1024 * 1024
    postgres_url: str | None = None
    s3_bucket: str | None = None
    sqs_queue_url: str | None = None

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            env = os.environ.get(ENV_PREFIX + name.upper())
            if env is not None and env != "":
                values[name] = env
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{ENV_PREFIX}{'.'.join(map(str, e['loc'])).upper()} / --"
                f"{'.'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(f"bad setting: {problems}") from exc

    def world_options(self) -> dict[str, Any]:
        """The options of the chosen World's backend (only the ones it takes)."""
        options: dict[str, Any] = {"max_attempts": self.max_attempts}
        if self.world == "postgres":
            options["url"] = self.postgres_url
        elif self.world == "s3sqs":
            options["bucket"] = self.s3_bucket
            options["queue_url"] = self.sqs_queue_url
        elif self.world == "local":
            options["data_dir"] = self.data_dir
        # A URL or a folder path as the World names its own location.
        return options
