"""Configuration: flags over ``DURABLE_HARNESS_*`` environment variables over defaults.

Every setting is a field of a pydantic-settings model whose environment variable is
``DURABLE_HARNESS_<FIELD NAME UPPER>`` (an empty variable counts as unset) and whose flag,
where the CLI has one, is ``--<field-name>``. :class:`Settings` holds the knobs every
process has; each World backend owns its own :class:`WorldSettings` (the PostgreSQL URL,
the S3 bucket, the local folder) next to its code in ``worlds/``, read only when that
World is opened. A bad value is one :class:`ConfigError` naming the variable and the flag.
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from durable_harness.core.errors import ConfigError
from durable_harness.core.pricing import PriceTable, price_table

ENV_PREFIX = "DURABLE_HARNESS_"


def _split_list(value: Any) -> Any:
    """A list setting from its variable: a JSON list, or items separated by commas."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


#: A list of strings read as ``a,b,c`` or as a JSON list (for items that hold commas).
ListSetting = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_list)]


def _json_object(value: Any) -> Any:
    """A mapping setting from its variable: a JSON object."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON object: {exc}") from None
    return value


class TenantBudget(BaseModel):
    """One tenant's spend limits (:attr:`Settings.tenant_budgets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = Field(default=None, gt=0)
    usd: float | None = Field(default=None, gt=0)


class EnvSettings(BaseSettings):
    """A settings model read from ``DURABLE_HARNESS_<NAME>`` variables; see :meth:`load`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore")

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """The settings from ``overrides`` (flags; ``None`` means not given) over the
        environment over the defaults. :class:`ConfigError` names each bad value's
        environment variable and flag."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            problems = "; ".join(
                f"{ENV_PREFIX}{'.'.join(map(str, e['loc'])).upper()} / --"
                f"{'.'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(f"bad setting: {problems}") from exc


class Settings(EnvSettings):
    """Every knob of the harness itself, with its environment variable
    ``DURABLE_HARNESS_<NAME upper>``. The World's own settings belong to its backend."""

    world: str = "local"
    lease_seconds: float = 30.0
    max_attempts: int = 5
    poll_seconds: float = 0.5
    #: How often a worker looks for a cancel request of the turn it runs (one World read
    #: per interval, none per step): a cancel stops the agent within about this long.
    cancel_poll_seconds: float = Field(default=1.0, gt=0)
    #: How long a worker told to stop (SIGTERM: a deploy) lets the step it is in finish
    #: before it releases its turn anyway and exits; it starts no new step meanwhile.
    stop_grace_seconds: float = Field(default=30.0, ge=0)
    #: How often a model step's streamed text is appended to the turn's event log (one
    #: ``text.delta`` per interval at most): lower is livelier, higher writes less.
    event_flush_seconds: float = Field(default=0.05, gt=0, le=10)
    #: A worker runs ``gc`` (runtime/gc.py) every ``gc_every_seconds`` when this is set:
    #: finished sessions idle for this many seconds are removed. None: workers never do.
    gc_older_than: float | None = Field(default=None, ge=0)
    gc_every_seconds: float = Field(default=3600.0, gt=0)
    #: A blob touched within this many seconds is never swept: longer than any step.
    gc_grace_seconds: float = Field(default=6 * 3600.0, ge=0)
    model: str = "claude-sonnet-4-5"
    max_tokens: int = 4096
    max_model_calls: int = 50
    #: Spend limits (harness/budget.py): tokens (every count of a model step's usage,
    #: summed) and US dollars (the price table), per turn, per session (all its turns)
    #: and per tenant (all the turns a ``serve`` tenant owns). None: no limit. The turn
    #: and session ones are ceilings a turn may lower; the tenant's is the operator's.
    budget_turn_tokens: int | None = Field(default=None, gt=0)
    budget_turn_usd: float | None = Field(default=None, gt=0)
    budget_session_tokens: int | None = Field(default=None, gt=0)
    budget_session_usd: float | None = Field(default=None, gt=0)
    budget_tenant_tokens: int | None = Field(default=None, gt=0)
    budget_tenant_usd: float | None = Field(default=None, gt=0)
    #: Per-tenant overrides of the two above, as JSON ``{"TENANT": {"tokens": N, "usd":
    #: X}}``: a unit a tenant's entry gives replaces the default for that tenant, one it
    #: leaves out keeps the default. An operator's setting: nothing a turn or a tenant
    #: writes (the World included) changes it.
    tenant_budgets: Annotated[dict[str, TenantBudget], NoDecode, BeforeValidator(_json_object)] = (
        Field(default_factory=dict)
    )
    max_files: int = 500
    max_bytes: int = 10 * 1024 * 1024
    #: The longest a tool may run, whatever timeout the model asks for: a bash command
    #: holds its worker (the lease renews) for as long as it runs. See core/sandbox.py.
    max_tool_timeout: float = Field(default=600.0, gt=0)
    #: The size of a Docker session's workspace and home volumes (a kernel-enforced
    #: tmpfs; None: a plain volume, bounded only by the Docker host's disk).
    max_workspace_bytes: int | None = Field(default=None, gt=0)
    # What the journaling proxy forwards with the harness's key (adapters/proxy/policy.py):
    # models besides the turn's, provider-side tool families and betas the operator
    # allows (comma-separated), the ceiling on max_tokens, unjournaled calls per launch.
    proxy_extra_models: ListSetting = ()
    proxy_server_tools: ListSetting = ()
    proxy_extra_betas: ListSetting = ()
    proxy_max_tokens: int = 128_000
    proxy_max_plain_calls: int = 200
    # -- the operator's policy over turns (runtime/admission.py): what a turn stored in
    # the World may choose among; the max_* above are its ceilings.
    #: Model endpoints a turn's base_url may name, besides the worker's own
    #: (ANTHROPIC_BASE_URL, OPENAI_BASE_URL): the worker's key goes there.
    allowed_base_urls: ListSetting = ()
    #: Toolchain images a turn's ``image`` may name (``run --image``; exact names as
    #: Docker knows them): the image's programs run in the sandbox.
    allowed_images: ListSetting = ()
    #: A repository's own Dockerfile (its devcontainer's ``build``, or ``run --image
    #: PATH``) is built at ``run`` (sandbox/repo_image.py): within this many seconds, from
    #: a context of at most this many bytes.
    toolchain_build_timeout: float = Field(default=1800.0, gt=0)
    toolchain_context_max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    #: The network of that build's ``RUN`` steps (``host``, ``none``, a network name);
    #: None: the Docker daemon's default (its bridge).
    toolchain_build_network: str | None = None
    #: Host tool files a turn may load: ``name=/path/tools.py[:LIST]`` (a turn names the
    #: set) or ``/path/tools.py`` (a ``path:LIST`` spec stored with a turn may name it).
    tool_sets: ListSetting = ()
    #: Folders a host-folder workspace must be in (symlinks followed).
    workspace_roots: ListSetting = ()
    #: Tools (of the CLI agents) a turn's agent config may label ``safe``.
    safe_tools: ListSetting = ()
    #: Shell patterns a turn's agent config may list in ``[replay] safe_bash``.
    safe_bash: ListSetting = ()
    #: Git remotes a turn's ``push_remote`` may name (the ``git_push`` tool pushes there
    #: with the worker's credentials), besides the ones typed at ``run`` in this process.
    allowed_push_remotes: ListSetting = ()
    #: The largest bundle of commits ``git_push`` takes out of a sandbox.
    push_max_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: Branch patterns ``git_push`` may push to (shell patterns, ``*`` crossing ``/``):
    #: ``dh/*,fix/*`` keeps the model off ``main`` whatever the remote protects.
    push_branches: ListSetting = ("*",)
    # -- a turn's setup phase (``run --setup``, adapters/cli/setup.py): the only time the
    # session's container reaches a network, through the harness's egress proxy.
    #: The ``host:port`` upstreams a setup may reach (exact; empty: no network at all).
    setup_registries: ListSetting = (
        "pypi.org:443",
        "files.pythonhosted.org:443",
        "registry.npmjs.org:443",
    )
    #: Seconds a setup command may run before it is stopped (the turn then fails).
    setup_timeout_s: float = Field(default=900.0, gt=0)
    #: Bytes a setup may download through the proxy, over all its connections.
    setup_max_bytes: int = Field(default=4 * 1024**3, gt=0)
    #: Setup commands a turn from elsewhere may carry (exact text; ``*``: any), besides
    #: the ones typed at ``run`` in this process: a setup reaches the registries above.
    allowed_setup_commands: ListSetting = ()
    #: The operator's price table: a JSON file merged over core/pricing.py's default,
    #: read when the settings load (a bad file stops the command at start).
    prices: Path | None = None
    _world_flags: dict[str, Any] = PrivateAttr(default_factory=dict)
    _prices: PriceTable | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_prices(self) -> Self:
        # A ConfigError (not a ValueError) goes through pydantic as it is, naming the file.
        self._prices = price_table(self.prices)
        return self

    def price_table(self) -> PriceTable:
        """What model steps cost (core/pricing.py), with the operator's file merged in."""
        if self._prices is None:
            self._prices = price_table(self.prices)
        return self._prices

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """As :meth:`EnvSettings.load`; an override that is not a field here (``data_dir``)
        is a flag for the World's backend, kept for :meth:`world_flags`."""
        settings = super().load(**{k: v for k, v in overrides.items() if k in cls.model_fields})
        settings._world_flags = {
            k: v for k, v in overrides.items() if v is not None and k not in cls.model_fields
        }
        return settings

    def world_flags(self) -> dict[str, Any]:
        """The flags given for the World's backend; it takes the ones it knows and reads
        the rest of its settings from its own environment variables."""
        return dict(self._world_flags)


class WorldSettings(EnvSettings, abc.ABC):
    """A World backend's settings (its fields and their ``DURABLE_HARNESS_*`` variables),
    declared by the backend as its ``settings_model``."""

    @abc.abstractmethod
    def world_options(self) -> dict[str, Any]:
        """The options these settings give the backend's ``from_options`` (only the ones
        that are set: a missing required one is the backend's error to word)."""


def take_max_attempts(world: str, options: dict[str, Any]) -> int:
    """Pop the ``max_attempts`` every World takes (default 5) from a backend's options."""
    value = options.pop("max_attempts", 5)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the {world} World's max_attempts must be a whole number, not {value!r}"
        ) from exc


def refuse_unknown_options(world: str, options: dict[str, Any]) -> None:
    """The options a backend did not take are mistakes: one error naming them all."""
    if options:
        raise ConfigError(f"unknown option(s) for the {world} World: {', '.join(sorted(options))}")


class ListenerSettings(EnvSettings):
    """The limits every HTTP listener of the harness applies (the journaling proxy, the
    signal server, the fake model; ``harness/listener/``): the operator's, never the
    client's. ``DURABLE_HARNESS_LISTENER_*``."""

    #: A request body larger than this is refused (413) before it is read further.
    listener_max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: Seconds a client has to send a request's headers, and again its body (408 or closed).
    listener_read_timeout_s: float = Field(default=30.0, gt=0)
    #: Seconds an idle keep-alive connection stays open.
    listener_keep_alive_s: float = Field(default=5.0, gt=0)
    #: Open connections plus requests in flight; past it a request is answered 503.
    listener_max_connections: int = Field(default=1024, gt=0)


class WebhookSettings(EnvSettings):
    """The operator's secrets for CI webhooks on ``signal-server`` (``runtime/webhooks.py``):
    ``DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET`` (the HMAC key GitHub signs with) and
    ``DURABLE_HARNESS_GITLAB_WEBHOOK_TOKEN`` (GitLab's secret token). Unset: that endpoint
    answers 404."""

    github_webhook_secret: SecretStr | None = None
    gitlab_webhook_token: SecretStr | None = None

    def secret(self, provider: str) -> str:
        value = self.github_webhook_secret if provider == "github" else self.gitlab_webhook_token
        return "" if value is None else value.get_secret_value()


class ServeSettings(EnvSettings):
    """``durable-harness serve``, the HTTP API for apps (``server/``): the operator's
    limits on its tenants. ``DURABLE_HARNESS_API_*``; 0 turns a rate limit off."""

    #: Turns a tenant may start per minute (a fixed window of the World's clock, counted
    #: in the World: every ``serve`` process shares it). Past it: 429 with Retry-After.
    api_turns_per_minute: int = Field(default=60, ge=0)
    #: Unfinished (queued, running, waiting) turns a tenant may have at once.
    api_max_concurrent_turns: int = Field(default=10, ge=0)
    #: The largest request body (a prompt, a signal's payload): 413 past it.
    api_max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    #: Seconds between the SSE stream's heartbeat comments (proxies close silent streams).
    api_heartbeat_s: float = Field(default=15.0, gt=0)
    #: Events held for one stream connection that has not read them yet; past it the
    #: follower leaves the rest in the World until the client catches up.
    api_stream_buffer: int = Field(default=1000, gt=0)
    #: Event streams one tenant may hold open on one ``serve`` at once (429 past it): a
    #: stream of a turn that never ends holds a connection, and connections are shared.
    api_max_streams_per_tenant: int = Field(default=20, gt=0)
    #: Seconds a stream stays open before the server ends it; the client resumes from
    #: ``Last-Event-ID`` (``durable_harness.client`` does by itself). Bounds what an idle
    #: stream holds, and how long a revoked token's stream lasts at most.
    api_stream_max_s: float = Field(default=600.0, gt=0)
    #: Signals a tenant may post per minute (``POST /v1/turns/{id}/signals/{name}``), and
    #: sessions it may create per minute: each is stored in the World.
    api_signals_per_minute: int = Field(default=600, ge=0)
    api_sessions_per_minute: int = Field(default=60, ge=0)
    #: The largest signal payload (bytes of JSON): 413 past it.
    api_max_signal_bytes: int = Field(default=64 * 1024, gt=0)
    #: Seconds the follower waits between reads of the World's event logs when the World
    #: cannot say that an event landed (PostgreSQL's NOTIFY ends the wait at once).
    api_follow_poll_s: float = Field(default=0.2, gt=0)
    #: Repositories a session may be seeded from (``repo``; exact URL or path as given):
    #: serve clones them with its own git config and credentials.
    api_allowed_repos: ListSetting = ()
    #: Items a filtered list request (``GET /v1/turns?status=``, ``?q=``) examines at most:
    #: past it the page ends early, short or empty, with a cursor to go on from.
    api_list_scan: int = Field(default=1000, ge=10)
    #: Tenant tokens (by token id) that may decide approvals
    #: (``POST /v1/turns/{id}/steps/{seq}/approval``) on their own tenant's turns; operator
    #: tokens may always. A tenant token not named here is refused (403).
    api_approver_tokens: ListSetting = ()


class AgentUserSettings(EnvSettings):
    """Who a host-folder agent runs as (the built-in agent's local sandbox, a CLI on a host
    folder): ``DURABLE_HARNESS_AGENT_USER``, an unprivileged account of its own (the worker
    must be root to switch to it; scripts/setup creates the default one), unless the
    operator accepts ``DURABLE_HARNESS_UNSAFE_SAME_USER=1``: the agent then runs with the
    worker's uid and can read the worker's environment and the World's files."""

    agent_user: str = "durable-harness-agent"
    unsafe_same_user: bool = False
