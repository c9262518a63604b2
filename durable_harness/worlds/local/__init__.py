"""The embedded World: one folder holding a SQLite database and a blob folder.

Layout::

    <data_dir>/world.sqlite3     sessions, turns (which double as the queue), steps
    <data_dir>/blobs/ab/cdef...  content-addressed payloads, named by their sha256 hex

Several worker processes on one machine may share the folder. The World is composed of
its facets, one module each: :mod:`.db` (the connection, transactions and migrations, and
the fence every lease-holder's write passes), :mod:`.blobs` (the blob folder),
:mod:`.catalog` (sessions and turns), :mod:`.queue` (the queue, leases and waits, kept in
the turns table), :mod:`.journal` (the steps), :mod:`.events` (each turn's event log) and
:mod:`.tenancy` (API tokens, owners, rate counters), :mod:`.retention` (what ``gc``
removes); :mod:`.schema` is what is stored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from pydantic import Field

from durable_harness.core.errors import ConfigError, WorldError
from durable_harness.core.settings import (
    WorldSettings,
    refuse_unknown_options,
    take_max_attempts,
)
from durable_harness.core.world import World
from durable_harness.worlds.local.blobs import BlobFolder
from durable_harness.worlds.local.catalog import LocalCatalog
from durable_harness.worlds.local.db import BUSY_TIMEOUT_MS, DB_NAME, OTHER_FOLDER, Database
from durable_harness.worlds.local.events import LocalEvents
from durable_harness.worlds.local.journal import LocalJournal
from durable_harness.worlds.local.queue import LocalQueue
from durable_harness.worlds.local.retention import LocalRetention
from durable_harness.worlds.local.schema import MIGRATIONS
from durable_harness.worlds.local.tenancy import LocalTenancy

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DB_NAME",
    "MIGRATIONS",
    "LocalSettings",
    "LocalWorld",
    "default_data_dir",
]


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/durable-harness``, by default ``~/.local/share/durable-harness``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "durable-harness"


class LocalSettings(WorldSettings):
    """The folder: ``DURABLE_HARNESS_DATA_DIR`` / ``--data-dir``."""

    data_dir: Path = Field(default_factory=default_data_dir)

    def world_options(self) -> dict[str, Any]:
        return {"data_dir": self.data_dir}


class LocalWorld(
    LocalCatalog, LocalQueue, LocalJournal, LocalEvents, LocalTenancy, LocalRetention, World
):
    """A World in a local folder; see the module docstring for the layout and its facets."""

    settings_model: ClassVar[type[WorldSettings]] = LocalSettings

    @classmethod
    def from_options(cls, **options: Any) -> LocalWorld:
        """``data_dir`` (or ``url``: ``file:///path`` or a folder path) and ``max_attempts``."""
        url = options.pop("url", None)
        if url is not None:
            options["data_dir"] = _folder_of(str(url), options.get("data_dir"))
        if "data_dir" not in options:
            raise ConfigError(
                "the local World needs a folder: pass data_dir (or a path as the World)"
            )
        data_dir = options.pop("data_dir")
        max_attempts = take_max_attempts("local", options)
        refuse_unknown_options("local", options)
        return cls(data_dir, max_attempts=max_attempts)

    def __init__(self, data_dir: str | Path, max_attempts: int = 5) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.max_attempts = max_attempts
        self._blobs = BlobFolder(self.data_dir / "blobs")
        self._db = Database(self.data_dir / DB_NAME)
        try:
            # Private to the worker's user: every turn's journal and signal secret is here,
            # and a host-folder agent runs as another user (sandbox/agent_user.py).
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.data_dir.stat().st_uid == os.geteuid():
                self.data_dir.chmod(0o700)
            self._blobs.root.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise WorldError(
                f"cannot create the World folder {self.data_dir}: {exc}; {OTHER_FOLDER}"
            ) from exc
        self._db.open()

    def close(self) -> None:
        self._db.close()

    def put_blob(self, data: bytes) -> str:
        return self._blobs.put(data)

    def get_blob(self, digest: str) -> bytes:
        return self._blobs.get(digest)


def _folder_of(url: str, data_dir: object) -> str:
    """The folder a ``local://`` or ``file://`` URL or a plain path names; it must agree
    with ``data_dir``."""
    path = url
    if "://" in url:
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.strip("/"):
            raise ConfigError(
                f"{url!r}: a {parsed.scheme}:// World is a folder on this machine: write "
                f"{parsed.scheme}:///absolute/path (three slashes) or a plain path"
            )
        path = unquote(parsed.path)
    if data_dir is not None and Path(str(data_dir)) != Path(path):
        raise ConfigError(f"World {url!r} names a folder, but data_dir says {data_dir}")
    return path
