"""A turn's journal for the viewer: ``GET /v1/turns/{id}/steps`` (every step, as ``show``
prints it, with its times) and ``GET /v1/turns/{id}/steps/{seq}`` (one step's recorded
input and output); ``POST /v1/turns/{id}/steps/{seq}/approval`` decides an approval step
(``runtime/approvals.py``): an operator token, or a token of the turn's tenant that the
operator named in ``DURABLE_HARNESS_API_APPROVER_TOKENS`` (any other token: 403).

The detail is the journal's own text: the canonical JSON a step recorded, a blob fetched
from the World only when that step is asked for. Each side is cut at :data:`MAX_TEXT`
bytes (on a character boundary), with ``truncated``: a tool output may be megabytes, and
the page shows it as text. Another tenant's turn is the same 404 as an unknown one.
"""

from __future__ import annotations

import codecs
from typing import Any

from fastapi import APIRouter, Path

from durable_harness.core.errors import NotFound
from durable_harness.core.keys import BLOB_PREFIX
from durable_harness.core.types import Step, StepStatus, Turn, TurnStatus
from durable_harness.runtime.approvals import DecisionRefused, record_decision
from durable_harness.runtime.views import step_row
from durable_harness.server.auth import Caller
from durable_harness.server.context import Auth, Context, Ctx
from durable_harness.server.errors import ApiError
from durable_harness.server.models import (
    ERRORS,
    Decide,
    DecisionOut,
    StepDetail,
    StepList,
    StepRow,
)

router = APIRouter(prefix="/v1", responses=ERRORS)

#: The most bytes of a step's input or of its output one detail carries.
MAX_TEXT = 256 * 1024
Seq = Path(ge=0, le=2**31 - 1)


def step_out(step: Step, row: dict[str, Any], turn: Turn) -> StepRow:
    """``row`` (``runtime.views.step_row``, what ``show`` prints) with the step's times.
    A parked turn's open step is its wait: ``how`` says ``waiting``, not ``interrupted``
    (no worker holds the turn because none needs to)."""
    how = row["how"]
    if step.status is StepStatus.INTENT and turn.status is TurnStatus.WAITING:
        how = "waiting"
    return StepRow(
        seq=step.seq,
        kind=step.kind,
        name=step.name,
        key=step.key,
        status=step.status.value,
        how=how,
        attempts=step.attempts,
        delivery=row.get("recorded_by_delivery"),
        epoch=step.epoch,
        started_at=step.started_at,
        finished_at=step.finished_at,
        duration=row.get("duration"),
        input_tokens=row.get("input_tokens"),
        output_tokens=row.get("output_tokens"),
        cache_read_tokens=row.get("cache_read_tokens", step.meta.get("cache_read_tokens")),
        cost_usd=row.get("cost_usd"),
        approval=row.get("approval"),
        settled=row.get("settled"),
    )


@router.get("/turns/{turn_id}/steps", response_model=StepList)
def list_steps(turn_id: str, ctx: Ctx, caller: Auth) -> StepList:
    """Every step of the turn in ``seq`` order: what ran live, what the latest delivery
    read back, what possibly ran, what was interrupted."""
    turn = ctx.turn(caller, turn_id)
    steps = ctx.world.load_steps(turn.turn_id)
    prices = ctx.settings.price_table()  # the operator's DURABLE_HARNESS_PRICES, if set
    return StepList(steps=[step_out(s, step_row(s, turn, prices), turn) for s in steps])


@router.get("/turns/{turn_id}/steps/{seq}", response_model=StepDetail)
def get_step(turn_id: str, ctx: Ctx, caller: Auth, seq: int = Seq) -> StepDetail:
    """One step's input and output as text (JSON), each cut at 256 KiB."""
    turn = ctx.turn(caller, turn_id)
    step = next((s for s in ctx.world.load_steps(turn.turn_id) if s.seq == seq), None)
    if step is None:
        raise ApiError(404, f"turn {turn_id!r} has no step {seq}", "step_not_found")
    raw_input = _stored(ctx, step.input)
    if step.output_blob is not None:
        raw_output: bytes | None = ctx.world.get_blob(step.output_blob)
    else:
        raw_output = None if step.output is None else step.output.encode("utf-8", "surrogatepass")
    text_in, cut_in = _cut(raw_input)
    text_out, cut_out = _cut(raw_output)
    return StepDetail(
        seq=step.seq,
        kind=step.kind,
        name=step.name,
        status=step.status.value,
        input=text_in,
        output=text_out,
        input_bytes=len(raw_input or b""),
        output_bytes=len(raw_output or b""),
        truncated=cut_in or cut_out,
    )


@router.post("/turns/{turn_id}/steps/{seq}/approval", response_model=DecisionOut)
def decide(turn_id: str, body: Decide, ctx: Ctx, caller: Auth, seq: int = Seq) -> DecisionOut:
    """Approve or reject the tool call that approval step ``seq`` holds back; the turn
    wakes. The first decision stands (a later one: ``new`` false)."""
    turn = ctx.turn(caller, turn_id)  # another tenant's turn: the one 404
    if not may_approve(ctx, caller):
        raise ApiError(
            403,
            "this token may not decide approvals: the operator lists approvers' token ids "
            "in DURABLE_HARNESS_API_APPROVER_TOKENS",
            "not_an_approver",
        )
    by = f"token:{caller.token_id} ({'operator' if caller.operator else caller.tenant})"
    try:
        done = record_decision(ctx.world, turn.turn_id, seq, body.approved, by, body.reason)
    except NotFound:
        raise ApiError(
            404, f"turn {turn_id!r} has no approval step {seq}", "step_not_found"
        ) from None
    except DecisionRefused as exc:
        raise ApiError(409, str(exc), "not_waiting") from None
    d = done.decision
    return DecisionOut(
        turn_id=turn_id,
        seq=seq,
        new=done.new,
        approved=d.approved,
        by=d.by,
        at=d.at,
        reason=d.reason,
    )


def may_approve(ctx: Context, caller: Caller) -> bool:
    """Operator tokens, and the tenant tokens the operator named approvers."""
    return caller.operator or caller.token_id in ctx.limits.api_approver_tokens


def _stored(ctx: Context, text: str | None) -> bytes | None:
    """A step's stored input: inline, or a reference to the blob holding it."""
    if text is None:
        return None
    if text.startswith(BLOB_PREFIX):
        return ctx.world.get_blob(text.removeprefix(BLOB_PREFIX))
    return text.encode("utf-8", "surrogatepass")


def _cut(data: bytes | None) -> tuple[str | None, bool]:
    """At most :data:`MAX_TEXT` bytes as text, and whether it was cut. A character the
    cut splits is left out whole; bytes that are not UTF-8 (a lone surrogate the journal
    kept) read as U+FFFD."""
    if data is None:
        return None, False
    if len(data) <= MAX_TEXT:
        return data.decode("utf-8", "replace"), False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(data[:MAX_TEXT], final=False), True
