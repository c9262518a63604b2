"""harness/budget.py's counting, on steps built by hand: a finished call, a call finished
after a lost attempt, an intent (lost, or in flight elsewhere), priced by a known table;
and the error's message read back as ``show``, ``ls`` and the API report it."""

from __future__ import annotations

import pytest

from durable_harness.core.pricing import Price, PriceTable
from durable_harness.core.types import Step, StepStatus
from durable_harness.harness.budget import Limit, Spend, exceeded_message, exceeded_of, spent_by

PRICES = PriceTable({"m": Price(input=2.0, output=10.0, cache_read=0.2, cache_write=2.5)})
USAGE = {"model": "m", "input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 50}


def model_step(seq: int, status: StepStatus, attempts: int) -> Step:
    done = status is StepStatus.DONE
    return Step(
        turn_id="t", seq=seq, key=f"k{seq}", kind="model", name="m", input_hash="h",
        status=status, attempts=attempts, meta=dict(USAGE) if done else {},
    )  # fmt: skip


def test_lost_calls_count_the_step_before_and_max_tokens() -> None:
    steps = [
        model_step(0, StepStatus.DONE, 1),  # 1150 tokens
        Step(turn_id="t", seq=1, key="tool", kind="tool", name="x", input_hash="h"),
        model_step(2, StepStatus.DONE, 2),  # 1150, and one lost: 1150 + 500
        model_step(4, StepStatus.INTENT, 1),  # lost (or in flight): 1150 + 500
    ]
    spent = spent_by(steps, PRICES, max_tokens=500)
    assert (spent.tokens, spent.lost_calls) == (1150 * 2 + 1650 * 2, 2)
    call = (1000 * 2.0 + 100 * 10.0 + 50 * 0.2) / 1e6
    lost = (1150 * 2.0 + 500 * 10.0) / 1e6
    assert spent.usd == pytest.approx(2 * call + 2 * lost)
    # A model without a price counts its tokens only.
    assert spent_by(steps, PriceTable({}), 500) == Spend(spent.tokens, 0.0, 2)


def test_the_message_is_read_back() -> None:
    message = exceeded_message(Limit("tenant", "usd", 0.5), Spend(10, 0.75, 1))
    assert message.startswith("budget exceeded: tenant usd spent 0.750000 of limit 0.500000")
    assert "DURABLE_HARNESS_BUDGET_TENANT_USD" in message
    assert exceeded_of(message) == {"scope": "tenant", "unit": "usd", "spent": 0.75, "limit": 0.5}
    tokens = exceeded_message(Limit("session", "tokens", 5000), Spend(5500))
    assert "--budget-session-tokens" in tokens
    assert exceeded_of(tokens) == {
        "scope": "session", "unit": "tokens", "spent": 5500, "limit": 5000,
    }  # fmt: skip
    assert exceeded_of("the agent made 3 model calls") is None and exceeded_of(None) is None
