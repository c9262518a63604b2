"""Sessions and turns: create, read, list (paged), post a turn, fork one, cancel.

A session fixes the agent, workspace and tool sets of its turns, chosen from what the
operator registered; a turn's configuration is built here from the session, never
taken from the request (no endpoint, limit, tools file or agent config comes from a
caller). Every item is owned by the tenant that made it, recorded before the item
exists, so no moment shows it unowned; listing skips an owned id whose creation never
finished.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query

from durable_harness.adapters import ADAPTERS, get_adapter
from durable_harness.core.errors import NotFound
from durable_harness.core.turn_config import DOCKER, VIRTUAL
from durable_harness.core.types import Session, Turn, is_dead_lettered
from durable_harness.harness.budget import TURN_LIMITS, exceeded_of
from durable_harness.runtime.admission import admit
from durable_harness.runtime.cancel import request_cancel
from durable_harness.runtime.costs import Costs, session_costs, turn_costs
from durable_harness.runtime.turns import new_id, start_turn, turn_config
from durable_harness.server import listing
from durable_harness.server.auth import Caller
from durable_harness.server.context import Auth, Context, Ctx, decode_cursor, encode_cursor
from durable_harness.server.errors import ApiError
from durable_harness.server.models import (
    ERRORS,
    BudgetOut,
    CancelOut,
    CancelTurn,
    CreateSession,
    ForkTurn,
    PostTurn,
    SessionOut,
    SessionPage,
    TurnOut,
    TurnPage,
    TurnStarted,
)
from durable_harness.server.rates import admit_session, admit_turn

router = APIRouter(prefix="/v1", responses=ERRORS)

#: Agents a request may name: every registered one whose turns a worker runs (a custom
#: turn is a program's own loop on the Python API, not something a worker drives).
API_AGENTS = tuple(name for name in ADAPTERS if name != "custom")


def api_agents() -> tuple[str, ...]:
    """:data:`API_AGENTS` and the operator's ACP agents (``DURABLE_HARNESS_ACP_AGENTS``
    in the server's environment: defined by the operator, named by a request)."""
    from durable_harness.adapters.acp.operator import operator_agents

    return (*API_AGENTS, *(f"acp:{name}" for name in operator_agents()))


Limit = Query(default=50, ge=1, le=200)
Status = Query(default=None, description=f"one of {', '.join(listing.STATUSES)}")
Text = Query(default=None, max_length=200, description="a case-insensitive substring")


def session_out(session: Session, owner: str | None, costs: Costs | None = None) -> SessionOut:
    api = session.meta.get("api") or {}
    return SessionOut(
        **(costs or Costs()).as_dict(),
        session_id=session.session_id,
        created_at=session.created_at,
        agent=session.meta.get("agent"),
        workspace=api.get("workspace"),
        tools=list(api.get("tools") or []),
        tenant=owner,
    )


def turn_out(ctx: Context, turn: Turn) -> TurnOut:
    steps = ctx.world.load_steps(turn.turn_id)
    costs = turn_costs(ctx.world, turn.turn_id, ctx.settings.price_table(), steps)
    return TurnOut(
        **costs.as_dict(),
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        index=turn.index,
        status=turn.status.value,
        prompt=turn.prompt,
        reply=turn.result,
        error=turn.error,
        dead_lettered=is_dead_lettered(turn),
        budget_exceeded=_budget_out(turn.error),
        waiting_for=turn.waiting_for,
        attempts=turn.attempts,
        created_at=turn.created_at,
        finished_at=turn.finished_at,
        steps=len(steps),
    )


def _budget_out(error: str | None) -> BudgetOut | None:
    exceeded = exceeded_of(error)
    return None if exceeded is None else BudgetOut(**exceeded)


def _config(ctx: Context, agent: str, workspace: str | None, tools: list[str]) -> dict[str, Any]:
    """A turn's configuration, built by the operator's settings (what start_turn checks)."""
    return turn_config(
        agent=agent,
        workspace=workspace,
        tools=tools,
        model=None,
        base_url=None,
        settings=ctx.settings,
    )


@router.post("/sessions", status_code=201, response_model=SessionOut)
def create_session(body: CreateSession, ctx: Ctx, caller: Auth) -> SessionOut:
    """A session: its agent, workspace and tool sets (the operator's registered ones)."""
    admit_session(ctx.world, caller.tenant, ctx.limits)
    agents = api_agents()
    if body.agent not in agents:
        raise ApiError(
            422,
            f"agent {body.agent!r} is not one of this server's agents: {', '.join(agents)}",
            "unknown_agent",
        )
    unknown = [t for t in body.tools if t not in ctx.tool_sets]
    if unknown:
        have = ", ".join(sorted(ctx.tool_sets)) or "none"
        raise ApiError(
            422,
            f"tools {', '.join(map(repr, unknown))} not registered on this server "
            f"(registered: {have}; the operator adds them with serve --tool-set NAME=FILE.py)",
            "unknown_tools",
        )
    if body.workspace not in (None, VIRTUAL, DOCKER):
        # A host folder is a place on the workers' disk that two tenants could both name:
        # through the API a session gets a workspace of its own (virtual, or its container).
        raise ApiError(
            422,
            f"workspace {body.workspace!r}: the API offers {VIRTUAL!r} or {DOCKER!r} "
            "(a session's own); host folders are for the operator's `durable-harness run`",
            "workspace_not_offered",
        )
    config = _config(ctx, body.agent, body.workspace, body.tools)
    # What a worker of this operator would refuse, refused now (ConfigError: 422).
    get_adapter(body.agent).check(admit(config, ctx.settings).config, ctx.settings)
    seed = None
    if body.repo is not None:
        if body.repo not in ctx.limits.api_allowed_repos:
            raise ApiError(
                422,
                f"repo {body.repo!r} is not a repository this server seeds from "
                "(DURABLE_HARNESS_API_ALLOWED_REPOS)",
                "repo_not_allowed",
            )
        from durable_harness.runtime.seed import prepare_seed

        seed = prepare_seed(body.repo, config)
    session_id = new_id("ses")
    now = time.time()
    ctx.world.put_owner("session", session_id, caller.tenant, now)
    meta = {"agent": body.agent, "api": {"workspace": config["workspace"], "tools": body.tools}}
    session = ctx.world.create_session(session_id, meta)
    if seed is not None:
        from durable_harness.runtime.seed import record_seed

        record_seed(ctx.world, session_id, seed)
    return session_out(session, caller.tenant)


@router.get("/sessions", response_model=SessionPage)
def list_sessions(
    ctx: Ctx, caller: Auth, limit: int = Limit, cursor: str | None = None, q: str | None = Text
) -> SessionPage:
    """The caller's sessions, newest first (an operator token: every session); ``q``: a
    case-insensitive substring of the session id, its agent, or a turn's prompt or id."""
    keys, load = _source(ctx, caller, "session")
    keep = listing.session_filter(q, lambda session_id: ctx.world.list_turns(session_id))
    found = listing.page(
        keys, load, keep, limit, _keyset(decode_cursor(cursor)), ctx.limits.api_list_scan
    )
    prices = ctx.settings.price_table()
    out = [
        session_out(
            s,
            ctx.world.get_owner("session", s.session_id),
            session_costs(ctx.world, s.session_id, prices),
        )
        for s in found.items
    ]
    last = encode_cursor(found.next_cursor) if found.next_cursor else None
    return SessionPage(sessions=out, next_cursor=last)


def _source(ctx: Context, caller: Caller, kind: str) -> tuple[listing.Keys, Callable[[str], Any]]:
    """What :func:`listing.page` reads: the keys ``(created_at, id)`` newest first, and
    the item of an id (None: owned, but its creation never finished). A tenant's come
    from its owned items' keyset; an operator's from the whole catalog, which the World
    lists without a cursor (read whole and cut here: an operator's call)."""
    if caller.operator:
        items: dict[str, Any]
        if kind == "session":
            items = {s.session_id: s for s in ctx.world.list_sessions(limit=2**31)}
        else:
            items = {t.turn_id: t for t in ctx.world.list_turns(limit=2**31)}
        ascending = sorted((item.created_at, key) for key, item in items.items())

        def catalog(before: listing.Key | None, n: int) -> list[listing.Key]:
            end = len(ascending) if before is None else bisect.bisect_left(ascending, before)
            return ascending[max(0, end - n) : end][::-1]

        return catalog, items.get

    def owned(before: listing.Key | None, n: int) -> list[listing.Key]:
        return ctx.world.list_owned(caller.tenant, kind, limit=n, before=before)

    get = ctx.world.get_session if kind == "session" else ctx.world.get_turn

    def load(item_id: str) -> Any:
        try:
            return get(item_id)
        except NotFound:
            return None  # owned, but its creation never finished

    return owned, load


def _keyset(value: Any) -> tuple[float, str] | None:
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int | float)
        and not isinstance(value[0], bool)
        and isinstance(value[1], str)
    ):
        raise ApiError(400, "cursor is not one this API gave out", "bad_cursor")
    return float(value[0]), value[1]


@router.get("/sessions/{session_id}", response_model=SessionOut)
def get_session(session_id: str, ctx: Ctx, caller: Auth) -> SessionOut:
    session, owner = ctx.session(caller, session_id)
    return session_out(
        session, owner, session_costs(ctx.world, session_id, ctx.settings.price_table())
    )


def started(turn: Turn) -> TurnStarted:
    return TurnStarted(
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        index=turn.index,
        status=turn.status.value,
        events=f"/v1/turns/{turn.turn_id}/events",
    )


@router.post("/sessions/{session_id}/turns", status_code=202, response_model=TurnStarted)
def post_turn(session_id: str, body: PostTurn, ctx: Ctx, caller: Auth) -> TurnStarted:
    """Queue a turn in the session and answer at once: workers run it. A turn posted
    while an earlier one is unfinished runs after it."""
    session, owner = ctx.session(caller, session_id)
    if not body.prompt.strip():
        raise ApiError(422, "prompt is blank: say what the agent should do", "empty_prompt")
    tenant = owner or caller.tenant
    admit_turn(ctx.world, tenant, ctx.limits)
    api = session.meta.get("api") or {}
    agent = str(session.meta.get("agent") or "builtin")
    config = _config(ctx, agent, api.get("workspace"), list(api.get("tools") or []))
    # The caller's own limits, lowering the operator's (start_turn refuses a raise: 422).
    config.update(body.model_dump(include=set(TURN_LIMITS), exclude_none=True))
    turn_id = new_id("turn")
    ctx.world.put_owner("turn", turn_id, tenant, time.time())
    turn = start_turn(
        ctx.world, ctx.settings, body.prompt, config, session_id, queue_behind=True,
        turn_id=turn_id,
    )  # fmt: skip
    return started(turn)


@router.post("/turns/{turn_id}/fork", status_code=202, response_model=TurnStarted)
def fork_turn(turn_id: str, body: ForkTurn, ctx: Ctx, caller: Auth) -> TurnStarted:
    """A new session of the caller's that continues the turn from before step ``at``
    (docs/fork.md): the history before it read back, the workspace as it was there; its
    first turn is queued with ``prompt``. The original is not changed."""
    origin = ctx.turn(caller, turn_id)
    session, owner = ctx.session(caller, origin.session_id)
    if body.prompt and not body.prompt.strip():
        raise ApiError(
            422, "prompt is blank: give one, or none to go on from the cut", "empty_prompt"
        )
    tenant = owner or caller.tenant
    # Before the fork is made: a CLI agent's cut record is stored as it is made, which a
    # tenant past its limits must not be able to repeat.
    admit_session(ctx.world, tenant, ctx.limits)
    admit_turn(ctx.world, tenant, ctx.limits)
    from durable_harness.runtime.fork import prepare_fork

    session_id, new_turn = new_id("ses"), new_id("turn")
    fork, _ = prepare_fork(ctx.world, turn_id, body.at, body.prompt, session_id)
    # Built here from the origin session, as every API turn is, with the limits its
    # caller had set on the turn forked (start_turn refuses one above a ceiling).
    api = session.meta.get("api") or {}
    agent = str(session.meta.get("agent") or "builtin")
    config = _config(ctx, agent, api.get("workspace"), list(api.get("tools") or []))
    config.update({k: origin.config[k] for k in TURN_LIMITS if origin.config.get(k) is not None})
    now = time.time()
    ctx.world.put_owner("session", session_id, tenant, now)
    ctx.world.put_owner("turn", new_turn, tenant, now)
    turn = start_turn(
        ctx.world, ctx.settings, body.prompt, config, fork=fork, turn_id=new_turn,
        new_session_id=session_id, session_meta={"api": api},
    )  # fmt: skip
    return started(turn)


@router.get("/sessions/{session_id}/turns", response_model=TurnPage)
def list_session_turns(
    session_id: str, ctx: Ctx, caller: Auth, limit: int = Limit, cursor: str | None = None
) -> TurnPage:
    """The session's turns in order (index 0, 1, ...)."""
    ctx.session(caller, session_id)
    after = decode_cursor(cursor)
    if after is not None and not isinstance(after, int):
        raise ApiError(400, "cursor is not one this API gave out", "bad_cursor")
    rows = [t for t in ctx.world.list_turns(session_id) if after is None or t.index > after]
    page = rows[:limit]
    more = len(rows) > limit
    return TurnPage(
        turns=[turn_out(ctx, t) for t in page],
        next_cursor=encode_cursor(page[-1].index) if more and page else None,
    )


@router.get("/turns", response_model=TurnPage)
def list_turns(
    ctx: Ctx,
    caller: Auth,
    limit: int = Limit,
    cursor: str | None = None,
    status: str | None = Status,
    q: str | None = Text,
) -> TurnPage:
    """The caller's turns of every session, newest first (an operator token: every
    turn); ``status`` and ``q`` (prompt, turn id or session id) filter them."""
    keys, load = _source(ctx, caller, "turn")
    keep = listing.turn_filter(status, q)
    found = listing.page(
        keys, load, keep, limit, _keyset(decode_cursor(cursor)), ctx.limits.api_list_scan
    )
    last = encode_cursor(found.next_cursor) if found.next_cursor else None
    return TurnPage(turns=[turn_out(ctx, t) for t in found.items], next_cursor=last)


@router.get("/turns/{turn_id}", response_model=TurnOut)
def get_turn(turn_id: str, ctx: Ctx, caller: Auth) -> TurnOut:
    """Status, reply, error, what it waits for, deliveries, tokens and cost."""
    return turn_out(ctx, ctx.turn(caller, turn_id))


@router.post("/turns/{turn_id}/cancel", status_code=202, response_model=CancelOut)
def cancel_turn(turn_id: str, ctx: Ctx, caller: Auth, body: CancelTurn | None = None) -> CancelOut:
    """Ask for the turn to be cancelled (durable: a worker stops it and ends it
    ``cancelled``, keeping every finished step)."""
    turn = ctx.turn(caller, turn_id)
    reason = (body or CancelTurn()).reason
    requested = request_cancel(ctx.world, turn.turn_id, reason)
    return CancelOut(
        turn_id=turn_id, requested=requested, status=ctx.world.get_turn(turn_id).status.value
    )
