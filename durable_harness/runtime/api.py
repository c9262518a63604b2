"""The public Python API: ``from durable_harness import ...`` (docs/python-api.md).

Two ways in, over one journal:

* **Any agent** (the built-in one, Claude Code, Codex, OpenCode, Pi): :func:`run_turn`
  drives a turn here, as ``durable-harness run`` does; :func:`enqueue_turn` only queues it
  for a worker (:func:`run_worker`, or ``durable-harness worker``); :func:`resume_turn`
  finishes one whose process died. These call the same runtime code as the CLI.
* **A custom harness** (your own loop on the ``anthropic`` or ``openai`` SDK):
  :func:`journaled_turn` (``custom_turn.py``) opens a turn in which every
  :meth:`JournaledTurn.model_call` and :meth:`JournaledTurn.tool_call` is a journal step
  under the one replay policy of :class:`~durable_harness.harness.journal.Journal`.
  Running the same program again with the same turn id after a crash reads finished
  steps back (no model call is paid twice) and follows each interrupted tool's replay
  rule.

:func:`open_world` opens a World from a URL or a name; :func:`tool`, :class:`ToolContext`
and :data:`Replay` declare tools.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import Settings
from durable_harness.core.types import Replay, Turn
from durable_harness.core.world import World
from durable_harness.harness.tools import ToolContext, tool
from durable_harness.runtime.admission import grant
from durable_harness.runtime.custom_turn import JournaledTurn, ToolResult, journaled_turn
from durable_harness.runtime.seed import PreparedSeed, prepare_seed
from durable_harness.runtime.turns import claim_for_resume, make_worker, start_turn, turn_config
from durable_harness.worlds import open_configured

__all__ = [
    "JournaledTurn",
    "Replay",
    "ToolContext",
    "ToolResult",
    "enqueue_turn",
    "journaled_turn",
    "open_world",
    "resume_turn",
    "run_turn",
    "run_worker",
    "tool",
]

log = logging.getLogger(__name__)


# -- Worlds ---------------------------------------------------------------------------
def open_world(url_or_name: str | None = None, **settings: Any) -> World:
    """Open a World: ``local:///path`` (or ``file:///path``, or a plain folder path),
    ``postgresql://USER:PASSWORD@HOST/DB``, ``s3sqs://BUCKET[/PREFIX]?queue=QUEUE_URL``,
    or a name the settings know (``local``, ``postgres``, ``s3sqs``, configured by the
    ``DURABLE_HARNESS_*`` environment variables, docs/worlds.md). ``None`` is the
    ``DURABLE_HARNESS_WORLD`` the environment names (the local World by default).

    ``settings`` override those variables (``max_attempts=3``, ``data_dir=...``). The
    World is a context manager: ``with open_world(...) as world:``. A URL or name it cannot
    open raises :class:`ConfigError` saying what to write instead.
    """
    if url_or_name is not None and (not isinstance(url_or_name, str) or not url_or_name.strip()):
        raise ConfigError(
            f"open_world({url_or_name!r}): give a World URL (local:///path, postgresql://..., "
            "s3sqs://...), a folder path, or a name: local, postgres, s3sqs"
        )
    unknown = sorted(set(settings) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(
            f"open_world: unknown setting(s) {', '.join(unknown)}; the settings are "
            f"{', '.join(sorted(Settings.model_fields))}"
        )
    world: World = open_configured(Settings.load(world=url_or_name, **settings))
    return world


# -- turns of any agent ---------------------------------------------------------------
def enqueue_turn(
    world: World,
    prompt: str,
    *,
    agent: str = "builtin",
    workspace: str | None = None,
    tools: Iterable[str] = (),
    session_id: str | None = None,
    model: str | None = None,
    base_url: str | None = None,
    agent_config: Mapping[str, Any] | None = None,
    image: str | None = None,
    setup: str | None = None,
    settings: Settings | None = None,
    push_remote: str | None = None,
    ci_repo: str | None = None,
    repo: str | None = None,
    ref: str | None = None,
    include_uncommitted: bool = False,
) -> Turn:
    """Queue a turn for a worker, as ``durable-harness run --detach`` does; return it
    (status ``queued``).

    ``tools`` are ``path/to/file.py:NAME`` specs (NAME a list of :func:`tool` objects):
    a spec, not the objects, because any worker on any machine must load the same tools
    when it resumes the turn. With ``session_id`` the turn continues that session (it
    runs after the session's earlier turns). ``image`` names the repository's toolchain
    image for the Docker workspace (``run --image``), ``setup`` the command run in the
    session's container before the agent (``run --setup``). ``push_remote`` (a git URL or path,
    no credentials in it) offers the agent the ``git_push`` tool, which pushes there from
    the host with the worker's git credentials; with ``ci_repo`` (``github:OWNER/NAME``),
    each pushed commit's CI result comes as signal ``ci`` (``run --ci-repo``). The
    configuration is checked here: a bad
    agent, workspace or tools file raises :class:`ConfigError` now, not in a worker.

    ``repo`` (a folder or URL; ``ref``, ``include_uncommitted`` as ``run --repo`` takes
    them) seeds a new session's workspace from a git repository, as ``run --repo`` does
    (no implicit default here: the current folder is not assumed to be the project).
    """
    settings = settings or Settings.load()
    config = _config(
        agent, workspace, tools, model, base_url, agent_config, settings, push_remote, ci_repo
    )
    _toolchain(config, image, setup)
    seed = _seed(repo, ref, include_uncommitted, config)
    return start_turn(world, settings, prompt, config, session_id, queue_behind=True, seed=seed)


def run_turn(
    world: World,
    prompt: str,
    *,
    agent: str = "builtin",
    workspace: str | None = None,
    tools: Iterable[str] = (),
    session_id: str | None = None,
    model: str | None = None,
    base_url: str | None = None,
    agent_config: Mapping[str, Any] | None = None,
    image: str | None = None,
    setup: str | None = None,
    settings: Settings | None = None,
    push_remote: str | None = None,
    ci_repo: str | None = None,
    quiet: bool = True,
    repo: str | None = None,
    ref: str | None = None,
    include_uncommitted: bool = False,
) -> Turn:
    """Start a turn and drive it here to its end, as ``durable-harness run`` does; return
    the turn as it ended: ``status`` ``done`` with ``result`` the reply, ``failed`` with
    ``error``, ``waiting`` (parked on a signal or timer: a worker finishes it), or
    ``queued`` (released for a retry: a worker or :func:`resume_turn` finishes it).

    Arguments as for :func:`enqueue_turn`; ``quiet=False`` prints each step on stderr.
    If this process dies, the turn is still in the World: :func:`resume_turn` or any
    worker finishes it.
    """
    settings = settings or Settings.load()
    config = _config(
        agent, workspace, tools, model, base_url, agent_config, settings, push_remote, ci_repo
    )
    _toolchain(config, image, setup)
    seed = _seed(repo, ref, include_uncommitted, config)
    turn = start_turn(world, settings, prompt, config, session_id, seed=seed)
    worker = make_worker(world, settings, quiet=quiet)
    lease = world.claim_turn(turn.turn_id, worker.owner, settings.lease_seconds)
    if lease is not None:
        worker.drive(lease)
    return world.get_turn(turn.turn_id)


def resume_turn(
    world: World,
    turn_id: str,
    *,
    force: bool = False,
    settings: Settings | None = None,
    quiet: bool = True,
) -> Turn:
    """Finish one turn here, as ``durable-harness resume`` does: at once if no one holds
    it, after its holder's lease runs out, or at once with ``force`` (fencing the holder
    out). Returns the turn as it ended (see :func:`run_turn`)."""
    settings = settings or Settings.load()
    worker = make_worker(world, settings, quiet=quiet)
    lease = claim_for_resume(world, settings, turn_id, worker.owner, force=force, say=log.warning)
    if lease is not None:
        worker.drive(lease)
    return world.get_turn(turn_id)


def run_worker(
    world: World,
    *,
    until_idle: bool = True,
    max_turns: int | None = None,
    settings: Settings | None = None,
    quiet: bool = True,
) -> int:
    """Claim turns and drive them, as ``durable-harness worker`` does; return how many
    were driven. ``until_idle`` returns once nothing is queued, running or waiting."""
    worker = make_worker(world, settings or Settings.load(), quiet=quiet)
    return worker.run(until_idle=until_idle, max_turns=max_turns)


def _seed(
    repo: str | None, ref: str | None, include_uncommitted: bool, config: dict[str, Any]
) -> PreparedSeed | None:
    if repo is None:
        if ref is not None or include_uncommitted:
            raise ConfigError("ref= and include_uncommitted= need repo=: the repository to seed")
        return None
    return prepare_seed(repo, config, ref=ref, include_uncommitted=include_uncommitted)


def _toolchain(config: dict[str, Any], image: str | None, setup: str | None) -> None:
    """The repository's toolchain image and setup command (docs/docker.md), granted."""
    if image is not None:
        config["image"] = image
    if setup is not None:
        config["setup"] = setup
    if image is not None or setup is not None:
        grant(config)


def _config(
    agent: str,
    workspace: str | None,
    tools: Iterable[str],
    model: str | None,
    base_url: str | None,
    agent_config: Mapping[str, Any] | None,
    settings: Settings,
    push_remote: str | None = None,
    ci_repo: str | None = None,
) -> dict[str, Any]:
    if isinstance(tools, str):
        raise ConfigError(f"tools={tools!r}: pass a list of 'path/to/file.py:NAME' specs")
    config = turn_config(
        agent=agent,
        workspace=workspace,
        tools=list(tools),
        model=model,
        base_url=base_url,
        settings=settings,
        push_remote=push_remote,
        ci_repo=ci_repo,
    )
    if agent_config is not None:
        config["agent_config"] = dict(agent_config)
    # The caller is this process's operator: what it passes, a worker here may run (a
    # worker elsewhere needs its own operator's settings for it: runtime/admission.py).
    grant(config)
    return config
