"""The World seam's shape and how a backend is chosen and configured.

Every backend in ``worlds.BACKENDS`` implements every facet (an ABC refuses a backend that
forgets a method when it is constructed) and owns its settings; ``open_configured`` takes a
backend's settings from its flags over its ``DURABLE_HARNESS_*`` variables over its
defaults, and a World named by a URL or a path from that alone.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import Settings, WorldSettings
from durable_harness.core.world import BlobStore, Catalog, Doctor, JournalStore, Queue, World
from durable_harness.worlds import BACKENDS, backend_class, open_configured
from durable_harness.worlds.local import LocalSettings, LocalWorld


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_is_a_whole_world_with_its_own_settings(name: str) -> None:
    cls = backend_class(name)
    assert isinstance(cls, type) and issubclass(cls, World) and not inspect.isabstract(cls)
    for facet in (BlobStore, Catalog, Queue, JournalStore, Doctor):
        assert issubclass(cls, facet)
    assert issubclass(cls.settings_model, WorldSettings)
    assert "world" not in cls.settings_model.model_fields


def test_a_backend_that_forgets_a_method_is_refused_when_constructed(tmp_path: Path) -> None:
    class NoWaits(LocalWorld):
        suspend = Queue.suspend  # the abstract method, as if LocalWorld had none

    with pytest.raises(TypeError, match="suspend"):
        NoWaits(tmp_path)


def test_the_harness_settings_know_no_backend() -> None:
    for field in Settings.model_fields:
        assert field not in ("data_dir", "postgres_url", "s3_bucket", "sqs_queue_url"), field


def test_a_backend_is_imported_only_when_opened(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from durable_harness.core.settings import Settings\n"
        "from durable_harness.worlds import open_configured\n"
        f"open_configured(Settings.load(world={str(tmp_path / 'w')!r})).close()\n"
        "assert 'psycopg' not in sys.modules and 'boto3' not in sys.modules, 'eager import'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def opened_folder(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **flags: Any) -> Path:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with open_configured(Settings.load(**flags)) as world:
        assert isinstance(world, LocalWorld)
        return world.data_dir


def test_local_settings_flags_over_environment_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURABLE_HARNESS_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert opened_folder(monkeypatch, {}) == tmp_path / "xdg" / "durable-harness"
    env = {"DURABLE_HARNESS_DATA_DIR": str(tmp_path / "env")}
    assert opened_folder(monkeypatch, env) == tmp_path / "env"
    assert opened_folder(monkeypatch, env, data_dir=tmp_path / "flag") == tmp_path / "flag"
    # An empty variable is unset; a World named by a path ignores the folder settings.
    assert opened_folder(monkeypatch, {"DURABLE_HARNESS_DATA_DIR": ""}) == (
        tmp_path / "xdg" / "durable-harness"
    )
    named = opened_folder(monkeypatch, env, world=str(tmp_path / "named"), data_dir="/elsewhere")
    assert named == tmp_path / "named"


def test_max_attempts_reaches_the_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_MAX_ATTEMPTS", "3")
    with open_configured(Settings.load(world=str(tmp_path / "w"))) as world:
        assert world.max_attempts == 3


def test_a_backend_setting_missing_or_bad_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DURABLE_HARNESS_POSTGRES_URL", raising=False)
    with pytest.raises(ConfigError, match="set DURABLE_HARNESS_POSTGRES_URL"):
        open_configured(Settings.load(world="postgres"))
    monkeypatch.setenv("DURABLE_HARNESS_MAX_ATTEMPTS", "many")
    with pytest.raises(ConfigError, match=r"bad setting: DURABLE_HARNESS_MAX_ATTEMPTS / --max"):
        Settings.load()

    class Strict(LocalSettings):
        retries: int = 1

    monkeypatch.setenv("DURABLE_HARNESS_RETRIES", "x")
    with pytest.raises(ConfigError, match=r"bad setting: DURABLE_HARNESS_RETRIES / --retries"):
        Strict.load()


def test_unknown_worlds_are_refused_before_any_import() -> None:
    with pytest.raises(ConfigError, match="known Worlds: local, postgres, s3sqs"):
        open_configured(Settings.load(world="mongodb"))


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_bad_max_attempts_option_is_a_config_error(name: str) -> None:
    # Checked before the backend connects to anything.
    options = {"local": {"data_dir": "x"}, "postgres": {"url": "postgresql://h/db"}}
    given = options.get(name, {"bucket": "b", "queue_url": "q"})
    with pytest.raises(ConfigError, match="max_attempts must be a whole number, not 'many'"):
        backend_class(name).from_options(**given, max_attempts="many")
