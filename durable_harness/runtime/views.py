"""What ``show`` and ``ls`` print: rows built from the World, as text or JSON.

Money comes from :mod:`.costs`, priced by the table given (the settings' table: the
default with ``DURABLE_HARNESS_PRICES`` merged over it; the default when none is given).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_harness.core.pricing import PriceTable, price_table, step_cost, tokens
from durable_harness.core.types import Step, StepStatus, Turn
from durable_harness.core.world import World
from durable_harness.harness.approval import APPROVAL_KIND
from durable_harness.harness.budget import exceeded_of
from durable_harness.harness.journal import SETTLED, SETTLED_DONE
from durable_harness.runtime.costs import turn_costs


def step_row(step: Step, turn: Turn, prices: PriceTable | None = None) -> dict[str, Any]:
    """One line of ``show``. ``how`` says whether the outcome was computed by the turn's
    latest delivery (``live``) or read back from the journal by it (``replayed``). The
    token counts and ``model`` are a model step's (None for other steps)."""
    if step.status is StepStatus.INTENT:
        how = "interrupted" if turn.lease_owner is None else "running"
    elif step.status is StepStatus.POSSIBLY_RAN:
        how = "not re-run"
    elif step.meta.get(SETTLED) == SETTLED_DONE:
        how = "settled by its check"  # interrupted; its check found the effect
    else:
        how = "live" if step.meta.get("turn_attempt") == turn.attempts else "replayed"
    return {
        "seq": step.seq,
        "kind": step.kind,
        "name": step.name,
        "key": step.key,
        "status": step.status.value,
        "how": how,
        "attempts": step.attempts,
        "duration": step.meta.get("duration"),
        **_usage(step),
        "cost_usd": step_cost(step, prices or price_table()),
        "recorded_by_delivery": step.meta.get("turn_attempt"),
        "approval": approval_of(step),
        # An interrupted never tool's check: done, ran again, absent, unknown, check failed.
        "settled": step.meta.get(SETTLED),
    }


def approval_of(step: Step) -> dict[str, Any] | None:
    """An approval step's decision (``pending`` while it waits: who decided, when, why),
    ``{"decision": "rejected"}`` for the tool step a rejection stood in for (the tool did
    not run); None for every other step."""
    if step.kind == APPROVAL_KIND:
        if step.status is StepStatus.INTENT:
            return {"decision": "pending"}
        meta = step.meta
        return {
            "decision": meta.get("approval", "rejected"),
            "by": meta.get("decided_by"),
            "at": meta.get("decided_at"),
            "reason": meta.get("reason", ""),
        }
    if step.meta.get("approval") == "rejected":
        return {"decision": "rejected"}
    return None


def _usage(step: Step) -> dict[str, Any]:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    if step.kind != "model":
        return {"model": None, **dict.fromkeys(keys)}
    return {"model": step.meta.get("model") or step.name, **{k: tokens(step, k) for k in keys}}


def turn_row(turn: Turn) -> dict[str, Any]:
    return {
        "turn_id": turn.turn_id,
        "session_id": turn.session_id,
        "index": turn.index,
        "status": turn.status.value,
        "deliveries": turn.attempts,
        "epoch": turn.epoch,
        "lease_owner": turn.lease_owner,
        "lease_expires_at": turn.lease_expires_at,
        "prompt": turn.prompt,
        "result": turn.result,
        "error": turn.error,
        # {scope, unit, spent, limit} when a spend limit ended the turn (harness/budget.py).
        "budget_exceeded": exceeded_of(turn.error),
        "agent": turn.config.get("agent"),
        "waiting_for": turn.waiting_for,
        "created_at": turn.created_at,
        "finished_at": turn.finished_at,
    }


def costed_turn_row(world: World, turn: Turn, prices: PriceTable) -> dict[str, Any]:
    """:func:`turn_row` with the turn's tokens, cost and savings (runtime/costs.py)."""
    return {**turn_row(turn), **turn_costs(world, turn.turn_id, prices).as_dict()}


def show_data(world: World, turn_id: str, prices: PriceTable | None = None) -> dict[str, Any]:
    prices = prices or price_table()
    turn = world.get_turn(turn_id)
    steps = world.load_steps(turn_id)
    costs = turn_costs(world, turn_id, prices, steps)
    return {
        "turn": {**turn_row(turn), **costs.as_dict()},
        "steps": [step_row(s, turn, prices) for s in steps],
    }


def format_show(data: dict[str, Any]) -> str:
    t = data["turn"]
    lines = [
        f"turn {t['turn_id']}  session {t['session_id']}  #{t['index']}  {t['status']}  "
        f"deliveries {t['deliveries']}  agent {t['agent']}",
        f"prompt: {_short(t['prompt'], 100)}",
        f"{'seq':>4}  {'kind':<5}  {'name':<22}  {'status':<12}  {'how':<11}  "
        f"{'att':>3}  {'secs':>7}  {'tokens in/out':>13}  {'cached':>7}  {'cost':>9}",
    ]
    for s in data["steps"]:
        tokens, cached = "", ""
        if s["input_tokens"] is not None:
            tokens = f"{s['input_tokens']}/{s['output_tokens']}"
            cached = str(s["cache_read_tokens"])
        secs = "" if s["duration"] is None else f"{s['duration']:.3f}"
        cost = "" if s["kind"] != "model" else _usd(s["cost_usd"])
        lines.append(
            f"{s['seq']:>4}  {s['kind']:<5}  {_short(s['name'], 22):<22}  {s['status']:<12}  "
            f"{s['how']:<11}  {s['attempts']:>3}  {secs:>7}  {tokens:>13}  {cached:>7}  "
            f"{cost:>9}"
        )
        if s.get("approval") is not None:
            lines.append(f"{'':>6}{_approval_text(s['approval'])}")
    lines.append(
        f"tokens: {t['input_tokens']} in, {t['output_tokens']} out, "
        f"{t['cache_read_tokens']} cache read, {t['cache_write_tokens']} cache write  "
        f"cost {_usd(t['cost_usd'])}  saved {t['saved_model_calls']} model call(s) "
        f"({_usd(t['saved_usd'])}) by replay"
    )
    if t["result"] is not None:
        lines.append(f"reply: {t['result']}")
    if t["budget_exceeded"]:
        b = t["budget_exceeded"]
        lines.append(f"budget exceeded: {b['scope']} {b['unit']} {b['spent']} of {b['limit']}")
    if t["error"]:
        lines.append(f"error: {t['error']}")
    return "\n".join(lines)


def _approval_text(approval: dict[str, Any]) -> str:
    decision = approval["decision"]
    if decision == "pending":
        return "waits for a decision: durable-harness approve TURN SEQ [--reject --reason ...]"
    if "by" not in approval:
        return "not run: the call was rejected"
    when = datetime.fromtimestamp(float(approval["at"] or 0), UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    reason = f": {approval['reason']}" if approval.get("reason") else ""
    return f"{decision} by {approval['by']} at {when}{reason}"


def ls_data(
    world: World, limit: int = 50, prices: PriceTable | None = None
) -> list[dict[str, Any]]:
    prices = prices or price_table()
    return [costed_turn_row(world, t, prices) for t in world.list_turns(limit=limit)]


def format_ls(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no turns yet: start one with `durable-harness run PROMPT`"
    lines = [
        f"{'session':<22}  {'turn':<22}  {'#':>2}  {'status':<15}  {'dlv':>3}  {'cost':>9}  "
        f"{'saved':>9}  prompt"
    ]
    for r in rows:
        lines.append(
            f"{r['session_id']:<22}  {r['turn_id']:<22}  {r['index']:>2}  {_status(r):<15}  "
            f"{r['deliveries']:>3}  {_usd(r['cost_usd']):>9}  {_usd(r['saved_usd']):>9}  "
            f"{_short(r['prompt'], 50)}"
            + (f"  [waits for {r['waiting_for']}]" if r["waiting_for"] else "")
        )
    return "\n".join(lines)


def _status(row: dict[str, Any]) -> str:
    return "budget exceeded" if row.get("budget_exceeded") else str(row["status"])


def _usd(value: float | None) -> str:
    """Dollars to the hundredth of a cent (model calls are cheap); ``?``: no price."""
    return "?" if value is None else f"${value:.4f}"


def _short(text: str | None, width: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"
