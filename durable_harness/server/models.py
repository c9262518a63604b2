"""The API's wire format: pydantic models of every request and response body, which
FastAPI validates and publishes at ``/openapi.json``. Extra fields in a request are
refused (a misspelt option is an error, not a silent default)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Request):
    agent: str = Field(description="a registered agent (builtin, claude-code, codex, ...)")
    workspace: str | None = Field(
        default=None,
        description="virtual or docker (the session's own workspace); default: the agent's own",
    )
    repo: str | None = Field(
        default=None,
        description="seed the workspace from this repository (one the operator allows)",
    )
    tools: list[str] = Field(
        default_factory=list, description="names of tool sets the operator registered"
    )


class PostTurn(_Request):
    prompt: str = Field(min_length=1, description="what the agent should do")
    # Spend limits (docs/costs.md): each at most the operator's ceiling of that name
    # (DURABLE_HARNESS_BUDGET_*); above it the turn is refused (422). None: the ceiling.
    budget_turn_tokens: int | None = Field(default=None, gt=0)
    budget_turn_usd: float | None = Field(default=None, gt=0)
    budget_session_tokens: int | None = Field(default=None, gt=0)
    budget_session_usd: float | None = Field(default=None, gt=0)


class ForkTurn(_Request):
    at: int = Field(ge=0, description="the step of the turn the fork is cut before")
    prompt: str = Field(
        default="",
        description="what the fork's first turn is asked; empty: it goes on from the cut",
    )


class CancelTurn(_Request):
    reason: str = Field(default="cancelled through the API", max_length=2000)


class CostFields(BaseModel):
    """Tokens, money and savings (runtime/costs.py; prices: core/pricing.py, overridden
    by the operator's ``DURABLE_HARNESS_PRICES``)."""

    input_tokens: int = Field(default=0, description="input not read from or written to a cache")
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = Field(
        default=None, description="the priced model steps' cost; null when none has a price"
    )
    saved_model_calls: int = Field(
        default=0, description="model steps read back by a later delivery, once per read-back"
    )
    saved_usd: float | None = Field(
        default=0.0, description="what those calls cost; null when none has a price"
    )


class SessionOut(CostFields):
    session_id: str
    created_at: float
    agent: str | None
    workspace: str | None
    tools: list[str]
    tenant: str | None


class TurnStarted(BaseModel):
    turn_id: str
    session_id: str
    index: int
    status: str
    events: str = Field(description="the turn's event stream (SSE)")


class BudgetOut(BaseModel):
    scope: str = Field(description="turn, session or tenant")
    unit: str = Field(description="tokens or usd")
    spent: float
    limit: float


class TurnOut(CostFields):
    turn_id: str
    session_id: str
    index: int
    status: str
    prompt: str
    reply: str | None
    error: str | None
    dead_lettered: bool = Field(
        default=False, description="failed because the World gave up redelivering it"
    )
    budget_exceeded: BudgetOut | None = Field(
        default=None, description="failed because a spend limit was reached: which, how much"
    )
    waiting_for: str | None
    attempts: int
    created_at: float
    finished_at: float | None
    steps: int


class Page(BaseModel):
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null: last")


class SessionPage(Page):
    sessions: list[SessionOut]


class TurnPage(Page):
    turns: list[TurnOut]


class StepRow(BaseModel):
    """One step of a turn's journal, as ``show`` prints it, with its times."""

    seq: int
    kind: str = Field(
        description="model, tool (wait steps are tools) or approval (a human's decision "
        "before a gated tool runs)"
    )
    name: str
    key: str
    status: str = Field(description="intent, done or possibly_ran")
    how: str = Field(
        description="live (computed by the turn's latest delivery), replayed (read back by "
        "it), not re-run (a never tool interrupted: possibly ran), settled by its check (a "
        "never tool interrupted, whose check found the effect: its result), interrupted (an "
        "intent without outcome, no worker on it), waiting (the wait a parked turn is in) or "
        "running"
    )
    attempts: int
    delivery: int | None = Field(description="the delivery (1, 2, ...) that recorded it")
    epoch: int = Field(description="the lease epoch its intent was written under")
    started_at: float
    finished_at: float | None
    duration: float | None = Field(description="seconds the call ran (null: never finished)")
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cost_usd: float | None
    approval: dict[str, Any] | None = Field(
        default=None,
        description="an approval step's decision: pending, or approved/rejected with by, at "
        "and reason; {decision: rejected} on the tool step a rejection stood in for",
    )
    settled: str | None = Field(
        default=None,
        description="what an interrupted never tool's check answered: done (its result is "
        "the step's), ran again (absent, and the tool honours its idempotency key), absent, "
        "unknown or check failed (these three: possibly ran); null: no check was asked",
    )


class StepList(BaseModel):
    steps: list[StepRow]


class StepDetail(BaseModel):
    """A step's recorded input and output, as the journal holds them (JSON text; a blob
    fetched from the World), each cut at 256 KiB."""

    seq: int
    kind: str
    name: str
    status: str
    input: str | None = Field(description="null: not stored (a model call's request)")
    output: str | None = Field(description="null: no outcome yet")
    input_bytes: int
    output_bytes: int = Field(description="the whole output's size, before any cut")
    truncated: bool = Field(description="input or output was cut: neither parses as JSON")


class SignalOut(BaseModel):
    turn: str
    signal: str
    new: bool


class Decide(_Request):
    approved: bool = Field(description="true runs the call; false rejects it (it never runs)")
    reason: str = Field(default="", max_length=1000, description="why (the model reads it)")


class DecisionOut(BaseModel):
    turn_id: str
    seq: int
    new: bool = Field(description="false: the step was decided already; this one is ignored")
    approved: bool = Field(description="the decision that stands")
    by: str
    at: float
    reason: str


class CancelOut(BaseModel):
    turn_id: str
    requested: bool = Field(description="false: the turn had already finished")
    status: str


class Accepted(BaseModel):
    accepted: bool


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorDetail


#: What every route may answer besides its success, for the OpenAPI document: the
#: API's refusals (400, 401, 404, 405, 422, 429), the listener's (408, 413) and 503 (the
#: World or a sandbox backend is not answering, or too many connections).
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in (400, 401, 404, 405, 408, 413, 422, 429, 503)
}
