"""An ACP agent's session record in the World: its session id and the files of its
launch HOME that hold the session (the preset's ``record_files``).

A save is one blob, ``{"session": <ACP session id>, "files": {<HOME-relative path>:
<base64>}}``, pointed at by the session record ``acp-<preset>/<turn_id>/<epoch>``
(:func:`~durable_harness.core.keys.session_record_name`: one name per lease epoch, so a
fenced-out worker writes only a name no newer worker reads); the turn's final save is
the ``transcript`` of its last launch's outcome, where the session's next turn finds it
(:func:`~.cli.records.previous_turn_transcript`). Files are read where the agent runs
through :meth:`~.cli.host.CliHost.read_file` (no symlink of the agent's is followed).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
from dataclasses import dataclass, field
from typing import Any

from durable_harness.adapters.cli.host import CliHost
from durable_harness.adapters.cli.records import latest_turn_transcript
from durable_harness.core.keys import session_record_name
from durable_harness.core.world import World

__all__ = ["AcpRecord", "Saved", "load", "record_prefix"]

#: The most bytes of record files one save holds (a bigger session is saved without them).
MAX_RECORD_BYTES = 256 * 1024 * 1024


def record_prefix(preset: str) -> str:
    return f"acp-{preset}"


@dataclass
class Saved:
    session: str | None
    files: dict[str, bytes] = field(default_factory=dict)


def load(world: World, digest: str) -> Saved:
    data = json.loads(world.get_blob(digest))
    files = {str(k): base64.b64decode(v) for k, v in (data.get("files") or {}).items()}
    session = data.get("session")
    return Saved(session if isinstance(session, str) else None, files)


class AcpRecord:
    """Saves one launch's record (thread-safe through the caller's lock)."""

    def __init__(self, world: World, preset: str, patterns: tuple[str, ...]) -> None:
        self.world = world
        self.prefix = record_prefix(preset)
        self.patterns = patterns
        self.session: str | None = None

    def latest(self, session_id: str, turn_id: str, epoch: int) -> str | None:
        return latest_turn_transcript(world=self.world, session_id=session_id, turn_id=turn_id,
                                      epoch=epoch, record_prefix=self.prefix)  # fmt: skip

    def save(self, host: CliHost, home: str, session_id: str, turn_id: str, epoch: int) -> str:
        files: dict[str, str] = {}
        total = 0
        for rel in self._files(host, home):
            data = host.read_file(f"{home}/{rel}")
            if data is None:
                continue
            total += len(data)
            if total > MAX_RECORD_BYTES:
                break
            files[rel] = base64.b64encode(data).decode()
        body: dict[str, Any] = {"session": self.session, "files": files}
        digest = self.world.put_blob(json.dumps(body, sort_keys=True).encode())
        name = session_record_name(self.prefix, turn_id, epoch)
        self.world.put_session_record(session_id, name, digest)
        return digest

    def _files(self, host: CliHost, home: str) -> list[str]:
        found: list[str] = []
        for pattern in self.patterns:
            if not any(c in pattern for c in "*?["):
                found.append(pattern)
                continue
            folder = os.path.dirname(pattern)
            for path in host.find_files(f"{home}/{folder}", os.path.basename(pattern)):
                rel = os.path.relpath(path, home)
                if fnmatch.fnmatchcase(rel, pattern) and not rel.startswith(".."):
                    found.append(rel)
        return sorted(set(found))
