"""The one exception tree of durable-harness.

Every error the package raises on purpose derives from :class:`DurableHarnessError`.
Backend errors (sqlite3, psycopg, botocore, docker) are mapped at the backend's boundary
with ``raise WorldError(...) from exc`` so callers never catch a driver's exception.

::

    DurableHarnessError
    ├── ConfigError             bad flag, unknown agent/World, bad URL, missing API key
    │   ├── TurnRefused         a turn asks for more than the worker's operator allows
    │   └── RepositoryError     a repository, ref or remote that host git cannot use
    ├── ToolDefinitionError     a tool without a replay label, bad schema, unreadable tools file
    ├── ToolExited              a host tool raised SystemExit, KeyboardInterrupt or another
    │                           BaseException: its call's failure, never the worker's exit
    ├── ReplayDivergence        the replayed step differs from the recorded one (invariant 6)
    ├── WorldError              a storage/queue backend failed
    │   ├── NotFound            no such session, turn or blob
    │   ├── StepConflict        (turn_id, seq) or (turn_id, key) already taken (invariant 2)
    │   ├── LeaseLost           a write carried a stale lease epoch: fenced out (invariant 3)
    │   └── CorruptJournal      a stored row cannot be decoded
    ├── SandboxError            the workspace refused an operation (a tool error result)
    │   ├── WorkspaceLimit      the file-count or byte cap would be exceeded
    │   └── ResourceLimit       a command hit the sandbox's memory or process limit
    ├── SandboxUnavailable      the sandbox backend cannot be reached (Docker down, image
    │                           missing, container gone): retried, never a tool result
    ├── ModelError              the model endpoint failed; the step is not recorded as done
    ├── TurnFailed              the agent cannot finish this turn (e.g. too many model calls)
    ├── TurnSuspended           not a failure: a wait step parks the turn (no worker holds it)
    └── TurnCancelled           not a failure: the turn was asked to stop (``cancel``); no
                                new step starts, the worker ends it ``cancelled``

Messages that a user can cause say what to do next.
"""

from __future__ import annotations


class DurableHarnessError(Exception):
    """Root of every error durable-harness raises on purpose."""


class ConfigError(DurableHarnessError):
    """Bad configuration given by the user: flags, environment, files."""


class TurnRefused(ConfigError):
    """A turn's stored configuration asks for more than the claiming worker's operator
    allows (an endpoint, tools, a workspace, a limit): failed at claim, nothing run."""


class RepositoryError(ConfigError):
    """Host git refused a repository, ref, remote or push (``durable_harness/repo``): the
    message is git's own last line and what to do next. A push the model asked for that
    fails is its tool's error result."""


class ToolDefinitionError(DurableHarnessError):
    """A tool cannot be registered (for example it has no ``replay`` label)."""


class ToolExited(DurableHarnessError):
    """A host tool's function raised SystemExit (``sys.exit()``), KeyboardInterrupt or
    another non-``Exception`` BaseException. Left alone, that would end the worker (or the
    proxy thread serving the call) on every delivery of the turn; instead it is the call's
    failure, which the model is told, like any exception a tool raises."""


class ReplayDivergence(DurableHarnessError):
    """A step replayed with a different kind, name, key or input than was recorded.

    Raised loudly instead of silently returning a recorded result that belongs to a
    different call: the code or the prompt changed under a turn in flight.
    """


class WorldError(DurableHarnessError):
    """A World backend failed (storage or queue)."""


class NotFound(WorldError):
    """No such session, turn or blob."""


class StepConflict(WorldError):
    """A step with this ``seq`` or ``key`` already exists in the turn."""


class LeaseLost(WorldError):
    """The write carried a lease epoch that is no longer current: another worker owns the turn."""


class CorruptJournal(WorldError):
    """A journal row or blob could not be decoded."""


class SandboxError(DurableHarnessError):
    """A sandbox operation failed in a way the agent should see as a tool error."""


class WorkspaceLimit(SandboxError):
    """The workspace's file-count or byte cap would be exceeded."""


class ResourceLimit(SandboxError):
    """A command in the sandbox hit its memory or process limit; the message carries the
    command's output. The sandbox itself survived."""


class SandboxUnavailable(DurableHarnessError):
    """The sandbox backend cannot serve the turn now: Docker is not reachable, the agent
    image is not built on this machine, or the session's container vanished mid-turn.

    Not a :class:`SandboxError`: the agent must not see it as a tool result. A worker
    releases the turn for a retry (another machine, or this one once fixed); the CLI
    reports it as bad input with what to do next.
    """


class ModelError(DurableHarnessError):
    """The model endpoint failed (network, 5xx, 429, malformed reply). Retryable."""


class TurnFailed(DurableHarnessError):
    """The turn cannot finish and must not be retried (its replay would fail the same way)."""


class BudgetExceeded(TurnFailed):
    """A spend limit is reached before a model call (harness/budget.py): the turn ends,
    the session may continue with a raised limit in a new turn."""


class TurnSuspended(DurableHarnessError):
    """Raised by a wait step whose timer or signal has not come: the worker parks the turn
    (``World.suspend``) and moves on. The wait step stays an intent; when the turn wakes,
    the step runs again (waits replay as ``safe``) and finds its signal or its deadline."""

    def __init__(
        self, wake_at: float, waiting_for: str, signal: str | None = None, seen: int = 0
    ) -> None:
        super().__init__(f"waiting for {waiting_for}")
        self.wake_at = wake_at
        self.waiting_for = waiting_for
        self.signal = signal
        #: How many signals of that name the wait looked at: one more wakes the turn.
        self.seen = seen


class TurnCancelled(DurableHarnessError):
    """Raised where a cancelled turn would begin a new step (``Journal._begin``) or when
    its running agent was stopped for the cancel: the worker ends the turn ``cancelled``
    (``World.cancel_turn``). The steps finished before stay in the journal, and a later
    turn of the session continues from them."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the turn was cancelled: {reason}")
        self.reason = reason
