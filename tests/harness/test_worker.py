"""The worker loop against a World that fails for a while."""

from __future__ import annotations

from pathlib import Path

from durable_harness.core.errors import WorldError
from durable_harness.core.settings import Settings
from durable_harness.core.types import Lease
from durable_harness.runtime.worker import Worker
from durable_harness.worlds.local import LocalWorld


class FlakyWorld(LocalWorld):
    """Claims fail the first ``failures`` times, as during a database restart."""

    failures = 3

    def claim(self, owner: str, lease_seconds: float) -> Lease | None:
        if self.failures:
            self.failures -= 1
            raise WorldError("connection refused")
        return super().claim(owner, lease_seconds)


def test_worker_outlives_a_world_outage(tmp_path: Path) -> None:
    events: list[str] = []
    with FlakyWorld(tmp_path) as world:
        worker = Worker(world, Settings(poll_seconds=0.01), on_event=events.append)
        assert worker.run(until_idle=True) == 0
    assert sum("cannot claim turns (connection refused)" in e for e in events) == 3
