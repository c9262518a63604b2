"""The FastAPI application of ``durable-harness serve`` and the listener it runs on."""

from __future__ import annotations

import sys
from collections.abc import Callable

from fastapi import FastAPI

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import ServeSettings, Settings, WebhookSettings
from durable_harness.core.version import __version__
from durable_harness.core.world import World
from durable_harness.harness.listener import BodyLimit, Limits, Listener, wait_until_terminated
from durable_harness.runtime.admission import parse_tool_sets
from durable_harness.server import errors, resources, signals, steps, ui
from durable_harness.server.context import Context
from durable_harness.server.stream import Follower

DESCRIPTION = """\
Start coding-agent turns and follow them through crashes and closed tabs. Every request
carries `Authorization: Bearer dh_...` (an API token of a tenant, made with
`durable-harness token create`); a tenant sees only its own sessions and turns. Errors
are `{"error": {"code", "message"}}`. A turn's events stream as Server-Sent Events that
resume from `Last-Event-ID`.
"""


def build_app(
    world: World, settings: Settings, limits: ServeSettings, follower: Follower
) -> FastAPI:
    """The app over ``world``; ``settings`` is the operator's policy over the turns it
    starts (their tool sets, workspace roots, ceilings)."""
    app = FastAPI(
        title="durable-harness",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
    )
    names, _files = parse_tool_sets(settings.tool_sets)
    app.state.context = Context(
        world=world,
        settings=settings,
        limits=limits,
        webhooks=WebhookSettings.load(),
        follower=follower,
        tool_sets=frozenset(names),
    )
    errors.install(app)
    app.include_router(resources.router)
    app.include_router(signals.router)
    app.include_router(steps.router)
    ui.install(app)
    return app


class ApiServer:
    """The app on a :class:`Listener` (the operator's limits: body cap, header deadline,
    connections) with its event follower. Stateless: everything is in the World, so any
    number of these may serve one World."""

    def __init__(
        self,
        world: World,
        settings: Settings,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ServeSettings | None = None,
        caps: Limits | None = None,
    ) -> None:
        """``caps``: the listener's limits (default: the operator's, with the API's body cap)."""
        self.limits = limits or ServeSettings.load()
        self.follower = Follower(
            world, buffer=self.limits.api_stream_buffer, poll_s=self.limits.api_follow_poll_s
        )
        self.app = build_app(world, settings, self.limits, self.follower)
        caps = caps or Limits.from_settings(max_body=self.limits.api_max_body_bytes)
        app = ui.ViewerHeaders(self.app)
        self._listener = Listener(
            BodyLimit(app, caps, errors.listener_refusal), host, port, caps, name="serve"
        )

    @property
    def url(self) -> str:
        return self._listener.url

    def start(self) -> ApiServer:
        self.follower.start()
        self._listener.start()
        return self

    def stop(self) -> None:
        self._listener.stop()
        self.follower.stop()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    world: World,
    settings: Settings,
    host: str,
    port: int,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run until SIGTERM or Ctrl-C (``durable-harness serve`` and ``ui``); ``announce``
    gets the URL once the server listens (default: serve's line)."""
    try:
        server = ApiServer(world, settings, host, port)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): another serve or ui "
            "may be running there; pick another --port (0: a free one)"
        ) from exc
    server.start()
    try:
        if announce is None:
            print(f"serve: listening on {server.url} (OpenAPI at {server.url}/openapi.json)")
        else:
            announce(server.url)
        sys.stdout.flush()
        wait_until_terminated()
    finally:
        server.stop()
        sys.stdout.flush()
