"""A turn's configuration: what a worker anywhere needs to run the turn (never a secret
beyond the turn's own signal secret).

It is stored with the turn as a JSON object (``Turn.config``), written once by
``runtime/turns.py`` and read by every adapter, on every worker, for as long as the turn
can be resumed. :class:`TurnConfig` is that object's one typed view (pydantic, at the
edge): its field names are the stored keys, and :meth:`TurnConfig.stored` gives back
exactly the object that was read or built (keys never set stay absent, unknown keys are
kept), so turns stored by earlier versions still load and round-trip unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from durable_harness.core.errors import ConfigError

__all__ = ["DOCKER", "VIRTUAL", "TurnConfig"]

#: The in-memory workspace: the default when a turn names none.
VIRTUAL = "virtual"
#: The session's Docker container.
DOCKER = "docker"


class TurnConfig(BaseModel):
    """The stored turn configuration (see the module docstring). ``workspace`` is
    :data:`VIRTUAL`, :data:`DOCKER` or an absolute host folder."""

    # extra="allow": a key added by another version (or a caller of the Python API) is
    # kept, so a stored config round-trips exactly.
    model_config = ConfigDict(extra="allow", frozen=True)

    agent: str = "builtin"
    workspace: str = VIRTUAL
    tools: list[str] = []
    model: str | None = None
    max_tokens: int | None = None
    max_model_calls: int | None = None
    #: Spend limits (harness/budget.py), each at most the worker's setting of that name.
    budget_turn_tokens: int | None = None
    budget_turn_usd: float | None = None
    budget_session_tokens: int | None = None
    budget_session_usd: float | None = None
    max_files: int | None = None
    max_bytes: int | None = None
    #: Authenticates webhook signals for this turn; CLI launch tokens derive from it.
    signal_secret: str | None = None
    base_url: str | None = None
    #: Where the ``git_push`` tool pushes (a URL or path without credentials); none: the
    #: tool is not offered.
    push_remote: str | None = None
    #: The CI repository (``github:OWNER/NAME``, ``gitlab:GROUP/PROJECT``) whose results
    #: for each commit ``git_push`` pushes come to the turn as signal ``ci``.
    ci_repo: str | None = None
    #: The ``--agent-config`` TOML as a table; the agent's adapter validates it.
    agent_config: Any = None  # validated by the adapter, with its own error messages
    #: The repository's toolchain image (Docker workspace): the container runs the session
    #: image derived from it (sandbox/session_image.py).
    image: str | None = None
    #: The setup command (``run --setup``): run in the session's container before the
    #: agent, with the operator's registries reachable (adapters/cli/setup.py).
    setup: str | None = None
    #: The turn's OpenTelemetry trace id (32 lowercase hex), written at enqueue so every
    #: delivery's spans join one trace across worker deaths (runtime/telemetry). Any
    #: string loads; a worker uses it only if it is a valid trace id.
    trace_id: str | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any] | TurnConfig) -> TurnConfig:
        """The typed view of a stored config (a ``TurnConfig`` is returned as is).
        ConfigError when a key holds a value of the wrong type."""
        if isinstance(config, TurnConfig):
            return config
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(f"the turn's configuration is not valid: {exc}") from None

    @property
    def docker(self) -> bool:
        """Whether the turn runs in the session's Docker container."""
        return self.workspace == DOCKER

    def stored(self) -> dict[str, Any]:
        """The JSON object stored with the turn: only the keys that were given."""
        return self.model_dump(exclude_unset=True)
