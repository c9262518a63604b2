"""``durable-harness gc``: remove what finished sessions older than an age no longer need.

A mark and sweep over a World that keeps :class:`~durable_harness.core.world.Retention`:

1. **Expire.** Every session with no unfinished turn and no activity (its creation, a
   turn's creation or end) since ``now - older_than`` is removed with all its rows
   (turns, steps, events, signals, watches, records, owners), each in one transaction
   that checks again that it is expired: a turn created on it meanwhile keeps it.
2. **Mark.** The roots are every sha256 hex run in what remains (steps, turns, events,
   signals, records, session meta: live turns and kept sessions alike); each marked blob
   is read and the hex runs in it are marked too (a workspace manifest names its folders,
   a folder its files, a transcript chain its previous node), to the fixpoint. Any 64-hex
   run counts, so a blob the journal names in a way this module does not know is kept.
3. **Sweep.** A blob is deleted only if it is unmarked *and* untouched since
   ``now - grace``, checked by the World atomically with ``put_blob``'s touch
   (``Retention.delete_blobs``).

Why this is safe while turns run. A blob is named by the journal only after ``put_blob``
returned, and ``put_blob`` of a blob already stored touches it. A turn that reuses a
deduplicated blob after the mark therefore touched it after ``now - grace`` (the sweep
keeps it) or, if its ``put_blob`` lands after the delete, wrote it again. The grace
covers the other gap: a blob a running step put before the mark but names only in the
outcome it records after it; ``grace`` must be longer than any step (the default is
hours; a step is bounded by ``max_tool_timeout``).

Operator only: the CLI command and the worker setting (``gc_older_than``) run it, never
an API route, and nothing a turn carries changes what it removes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.core.retention import Retention, digests_in
from durable_harness.core.world import World

#: Blobs untouched for less than this are never swept (see the module docstring).
DEFAULT_GRACE_SECONDS = 6 * 3600.0
#: Blobs deleted per request of the sweep.
SWEEP_BATCH = 500
#: How often a long run reports its progress.
PROGRESS_SECONDS = 5.0

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a plain number of seconds."""
    value = text.strip().lower()
    factor = _UNITS.get(value[-1:])
    number = value[:-1] if factor is not None else value
    try:
        seconds = float(number) * (factor or 1.0)
    except ValueError:
        raise ConfigError(f"age {text!r}: write e.g. 30d, 12h, 90m or seconds") from None
    if not seconds >= 0:
        raise ConfigError(f"age {text!r}: must be zero or more")
    return seconds


@dataclasses.dataclass
class GcReport:
    """What one run removed (a dry run: would remove)."""

    dry_run: bool = False
    sessions: int = 0
    turns: int = 0
    steps: int = 0
    events: int = 0
    records: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    blobs_kept: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"gc {verb} {self.sessions} sessions ({self.turns} turns, {self.steps} steps, "
            f"{self.events} events, {self.records} records) and {self.blobs} blobs "
            f"({self.blob_bytes} bytes); kept {self.blobs_kept} blobs; {self.seconds:.2f}s"
        )


def collect(
    world: World,
    older_than: float,
    *,
    dry_run: bool = False,
    grace: float = DEFAULT_GRACE_SECONDS,
    progress: Callable[[str], None] | None = None,
    after_mark: Callable[[], None] | None = None,
) -> GcReport:
    """Run one gc over ``world`` (see the module docstring). ``after_mark`` runs between
    the mark and the sweep (what the race test holds the sweep at)."""
    if not isinstance(world, Retention):
        raise ConfigError(
            f"gc: the {type(world).__name__} keeps no retention support yet; its data stays"
        )
    if older_than < 0 or grace < 0:
        raise ConfigError("gc: older_than and grace must be zero or more")
    started = time.monotonic()
    report = GcReport(dry_run=dry_run)
    say = _Progress(progress)
    now = world.now()
    before = now - older_than
    dropped: list[str] = []
    for session_id in world.expired_sessions(before):
        gone = world.drop_session(session_id, before, dry_run)
        if gone is None:
            continue  # a turn came in: kept
        dropped.append(session_id)
        report.sessions += 1
        report.turns += gone.turns
        report.steps += gone.steps
        report.events += gone.events
        report.records += gone.records
        say(lambda: f"gc: {report.sessions} sessions {'to remove' if dry_run else 'removed'}")
    # A dry run removed nothing, so the mark leaves out what it would have removed.
    marked = world.referenced_digests(excluding=dropped if dry_run else ())
    pending = list(marked)
    while pending:
        digest = pending.pop()
        try:
            data = world.get_blob(digest)
        except NotFound:
            continue  # a hex run that names no blob (a hash, a commit): nothing to keep
        for found in digests_in(data) - marked:
            marked.add(found)
            pending.append(found)
        say(lambda: f"gc: {len(marked)} blobs marked, {len(pending)} to read")
    if after_mark is not None:
        after_mark()
    cutoff = now - grace
    doomed: list[str] = []
    for info in world.list_blobs():
        if info.digest in marked or info.touched_at >= cutoff:
            report.blobs_kept += 1
        elif dry_run:
            report.blobs += 1
            report.blob_bytes += info.size
        else:
            doomed.append(info.digest)
    for start in range(0, len(doomed), SWEEP_BATCH):
        batch = doomed[start : start + SWEEP_BATCH]
        freed = world.delete_blobs(batch, cutoff)
        report.blobs += len(freed)
        report.blob_bytes += sum(freed.values())
        report.blobs_kept += len(batch) - len(freed)  # touched since the listing: reused
        say(lambda: f"gc: {report.blobs} blobs ({report.blob_bytes} bytes) swept so far")
    report.seconds = time.monotonic() - started
    return report


class _Progress:
    """Calls ``sink`` with a line at most every :data:`PROGRESS_SECONDS`."""

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self.sink = sink
        self.last = time.monotonic()

    def __call__(self, line: Callable[[], str]) -> None:
        if self.sink is not None and time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last = time.monotonic()
            self.sink(line())
