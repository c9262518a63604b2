"""Signals, CI webhooks and the event stream: the routes that ``signal-server`` served,
and ``GET /v1/turns/{id}/events``.

``POST /v1/turns/{id}/signals/{name}`` takes either credential, checked before the body
is read: an API token whose tenant owns the turn (another tenant's turn is 404, as an
unknown one), or the turn's own signal secret (what ``signal-server`` takes; a wrong
secret or an unknown turn is 401). Names under ``dh.`` are the harness's own
(``dh.cancel``): a caller cancels through ``/cancel``. The CI webhooks are
``runtime/webhooks.py`` unchanged: the provider's signature over the raw body first.
"""

from __future__ import annotations

import re
import weakref
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.harness.events import signal_received
from durable_harness.harness.listener import token_matches
from durable_harness.runtime import webhooks
from durable_harness.runtime.signals import parse_payload
from durable_harness.server.auth import PREFIX, Caller, caller_of
from durable_harness.server.context import Auth, Context, Ctx
from durable_harness.server.errors import ApiError, unauthorized
from durable_harness.server.models import ERRORS, Accepted, SignalOut
from durable_harness.server.rates import admit_signal
from durable_harness.server.stream import events, settle_if_finished

router = APIRouter(prefix="/v1", responses=ERRORS)
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: An event's seq as a client sends it back: ASCII digits, at most 18 (int64 in every World).
_SEQ = re.compile(r"[0-9]{1,18}")
MAX_SEQ = 10**18 - 1


@router.post("/turns/{turn_id}/signals/{name}", response_model=SignalOut)
async def post_signal(
    turn_id: str,
    name: str,
    request: Request,
    ctx: Ctx,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Send signal ``name`` to the turn (it wakes a wait for it); the body is the JSON
    payload. A repeated ``Idempotency-Key`` (else the same payload) is answered 208."""
    header = request.headers.get("authorization")
    tenant = await run_in_threadpool(_authorize, ctx, turn_id, header)
    if not _NAME.fullmatch(name) or name.startswith("dh."):
        raise ApiError(
            422,
            f"signal name {name!r}: letters, digits and _.:- (dh.* is the harness's own; "
            "cancel with POST /v1/turns/{id}/cancel)",
            "bad_signal_name",
        )
    raw = await request.body()
    if len(raw) > ctx.limits.api_max_signal_bytes:
        raise ApiError(
            413,
            f"a signal's payload is at most {ctx.limits.api_max_signal_bytes} bytes "
            "(DURABLE_HARNESS_API_MAX_SIGNAL_BYTES): send a reference to larger data",
        )
    await run_in_threadpool(admit_signal, ctx.world, tenant, ctx.limits)
    try:
        payload = parse_payload(raw.decode("utf-8", "replace"))
    except ConfigError:
        raise ApiError(
            400, "the body is not JSON: send the payload as JSON", "malformed_json"
        ) from None
    fresh = await run_in_threadpool(_send, ctx, turn_id, name, payload, idempotency_key or None)
    out = SignalOut(turn=turn_id, signal=name, new=fresh)
    return JSONResponse(out.model_dump(), 200 if fresh else 208)


def _send(ctx: Context, turn_id: str, name: str, payload: str, delivery: str | None) -> bool:
    fresh = ctx.world.send_signal(turn_id, name, payload, delivery)
    # Also for a repeat: keyed by the delivery, it repairs an append a crash lost.
    signal_received(ctx.world, turn_id, name, payload, delivery)
    return fresh


def _authorize(ctx: Context, turn_id: str, header: str | None) -> str:
    """Check the credential; return whose signals these are (for the rate limit): the
    caller's tenant, or the turn's owner for its own secret (``-`` for a turn made
    outside serve)."""
    if header is not None and header.partition(" ")[2].strip().startswith(PREFIX):
        caller = caller_of(ctx.world, header)
        if caller is not None:
            ctx.turn(caller, turn_id)  # 404 unless the caller's
            return caller.tenant
    # The turn's own secret (signal-server's rule): an unknown turn answers as a wrong
    # secret, so a caller without it learns nothing, not even whether the turn exists.
    try:
        secret = str(ctx.world.get_turn(turn_id).config.get("signal_secret", ""))
    except NotFound:
        secret = ""
    given = (header or "").removeprefix("Bearer ").strip()
    if not token_matches(given, secret):
        raise unauthorized()
    return ctx.world.get_owner("turn", turn_id) or "-"


@router.post("/webhooks/{provider}", status_code=202, response_model=Accepted)
async def webhook(provider: str, request: Request, ctx: Ctx) -> Accepted:
    """A GitHub or GitLab CI result, routed to the turns that watch its commit or branch;
    202 whether or not any does."""
    if provider not in webhooks.PROVIDERS:
        raise ApiError(404, f"no webhook {provider!r}: github or gitlab")
    raw = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        webhooks.authenticate(provider, ctx.webhooks.secret(provider), headers, raw)
        result, delivery = webhooks.parse(provider, headers, raw)
    except webhooks.Refused as exc:
        raise ApiError(exc.status, str(exc)) from None
    if result is not None:
        await run_in_threadpool(webhooks.deliver, ctx.world, result, delivery)
    return Accepted(accepted=True)


@router.get(
    "/turns/{turn_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
        204: {"description": "the turn has ended and the client has every event"},
    },
)
async def turn_events(
    turn_id: str,
    ctx: Ctx,
    caller: Auth,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """The turn's events as Server-Sent Events (``id`` = seq, ``event`` = kind), from
    after ``Last-Event-ID`` or ``?after=N``: replayed from the World, then live, ending
    after ``turn.ended``; 204 when the client has had ``turn.ended`` already."""
    await run_in_threadpool(ctx.turn, caller, turn_id)
    start = after or 0
    if last_event_id is not None:
        if not _SEQ.fullmatch(last_event_id.strip()):
            raise ApiError(400, "Last-Event-ID must be an event's seq (a whole number)")
        start = int(last_event_id.strip())
    if await run_in_threadpool(_read_to_the_end, ctx, turn_id, start):
        # SSE's own "stop reconnecting": the client already has turn.ended.
        return Response(status_code=204)
    release = ctx.streams.take(caller.tenant, ctx.limits.api_max_streams_per_tenant)

    async def allowed() -> bool:
        return await run_in_threadpool(_still_valid, ctx, caller)

    stream = events(
        ctx.world,
        ctx.follower,
        turn_id,
        start,
        run_in_threadpool,
        lifetime=ctx.limits.api_stream_max_s,
        allowed=allowed,
        recheck_s=ctx.limits.api_heartbeat_s,
        release=release,
    )
    # A stream the response never iterated (the client left first) gives its slot back
    # when it is collected.
    weakref.finalize(stream, release)
    return EventSourceResponse(stream, ping=ctx.limits.api_heartbeat_s)


def _still_valid(ctx: Context, caller: Caller) -> bool:
    """Whether the stream's token still stands (not revoked since the stream began)."""
    try:
        return ctx.world.get_token(caller.token_id).revoked_at is None
    except NotFound:
        return False


def _read_to_the_end(ctx: Context, turn_id: str, after: int) -> bool:
    """Whether the turn is finished and its log holds nothing after ``after``."""
    if not settle_if_finished(ctx.world, turn_id):
        return False
    return not ctx.world.read_events(turn_id, after=after, limit=1)
