"""What every route of the app shares: the World, the operator's settings, the follower,
and the request's :class:`~.auth.Caller` (a FastAPI dependency)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import NotFound
from durable_harness.core.settings import ServeSettings, Settings, WebhookSettings
from durable_harness.core.types import Session, Turn
from durable_harness.core.world import World
from durable_harness.server.auth import Caller, caller_of
from durable_harness.server.errors import ApiError, not_found, unauthorized
from durable_harness.server.stream import Follower


class StreamSlots:
    """Open event streams per tenant on this ``serve`` (the event loop's only)."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def take(self, tenant: str, most: int) -> Callable[[], None]:
        """Count one more open stream of ``tenant`` (429 past ``most``); return what
        gives it back (idempotent: the stream's end and its collection both call it)."""
        if self._open.get(tenant, 0) >= most:
            raise ApiError(
                429,
                f"tenant {tenant!r} has {most} event streams open on this server, the most "
                "it may (DURABLE_HARNESS_API_MAX_STREAMS_PER_TENANT): close one",
                "too_many_streams",
                {"Retry-After": "5"},
            )
        self._open[tenant] = self._open.get(tenant, 0) + 1
        given_back = False

        def release() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self._open[tenant] -= 1

        return release


@dataclass
class Context:
    world: World
    settings: Settings  # the operator's policy over turns (tool sets, roots, ceilings)
    limits: ServeSettings
    webhooks: WebhookSettings
    follower: Follower
    tool_sets: frozenset[str]  # the names a session may choose among
    streams: StreamSlots = field(default_factory=StreamSlots)

    def session(self, caller: Caller, session_id: str) -> tuple[Session, str | None]:
        """The session and its owner, if the caller may see it; else the one 404."""
        owner = self.world.get_owner("session", session_id)
        if not caller.owns(owner):
            raise not_found("session", session_id)
        try:
            return self.world.get_session(session_id), owner
        except NotFound:
            raise not_found("session", session_id) from None

    def turn(self, caller: Caller, turn_id: str) -> Turn:
        """The turn, if the caller may see it; else the one 404."""
        if not caller.owns(self.world.get_owner("turn", turn_id)):
            raise not_found("turn", turn_id)
        try:
            return self.world.get_turn(turn_id)
        except NotFound:
            raise not_found("turn", turn_id) from None


def context(request: Request) -> Context:
    ctx: Context = request.app.state.context
    return ctx


def authenticated(request: Request) -> Caller:
    """The request's caller, or 401 (the same for a missing, malformed, unknown, wrong or
    revoked token)."""
    found = caller_of(context(request).world, request.headers.get("authorization"))
    if found is None:
        raise unauthorized()
    return found


Ctx = Annotated[Context, Depends(context)]
Auth = Annotated[Caller, Depends(authenticated)]


def encode_cursor(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Any:
    """A cursor this API gave out, or None; a 400 for anything else."""
    if cursor is None:
        return None
    try:
        return parse_json(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        raise ApiError(400, "cursor is not one this API gave out", "bad_cursor") from None
