"""Spend limits that a crash cannot reset: per turn, per session and per tenant, in
tokens and in US dollars (priced by :mod:`durable_harness.core.pricing`).

:meth:`Budget.check` runs in the journal before every model call it is about to make (a
new intent, or an interrupted one run again: :meth:`.journal.Journal._begin`), for the
built-in agent, a custom harness and, through the journaling proxy, every CLI agent. It
reads what was spent from the World each time, never from a counter of this process:

* **turn**: the turn's own steps (the journal's rows, read from the World when the
  delivery began and written through since);
* **session**: the turn's steps and those of every other turn of its session;
* **tenant**: the turn's steps and those of every other turn its tenant owns
  (``World.list_owned``; a turn made outside ``serve`` has no tenant).

What a model step spent: its recorded usage (the four counts of :mod:`.core.usage`
summed: every token billed) and its price; plus, for each attempt whose outcome was
lost (a crash after the call was sent, before its outcome was recorded: a step still
an intent, or one finished after ``attempts - 1`` restarts), a *lost call*: an
estimate, since its usage was never recorded, of the tokens of the turn's model step
before it (its request holds at least that conversation again) as input and the turn's
``max_tokens`` (the most output a request of the built-in agent may ask for; for a CLI's
request, a declared estimate) as output, priced as such. A call another worker, or
another thread, is making now is an intent too: it counts as a lost call until its
outcome is recorded.

A limit is reached when what is spent is at least the limit: the call is not made and
:class:`BudgetExceeded` ends the turn (status ``failed``, error ``budget exceeded: ...``,
read back by :func:`exceeded_of`). With a USD limit in force, a call to a model the
price table does not know is refused too (its spend could not be counted); a past step
of another turn whose model has no price counts its tokens only.

Finished turns never change: their spend is kept per World in a bounded cache (facts
read from the World, not a counter; a new process reads them again).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_harness.core.errors import BudgetExceeded, NotFound, TurnFailed
from durable_harness.core.pricing import PriceTable, step_model, tokens
from durable_harness.core.settings import Settings
from durable_harness.core.types import FINISHED, Step, StepStatus
from durable_harness.core.usage import TOKEN_KEYS
from durable_harness.core.world import World

__all__ = [
    "OPERATOR_ONLY",
    "TURN_LIMITS",
    "Budget",
    "Limit",
    "Spend",
    "exceeded_of",
    "spent_by",
]

SCOPES = ("turn", "session", "tenant")
UNITS = ("tokens", "usd")
#: The limits a turn's configuration may hold (each at most the worker's setting of the
#: same name, the operator's ceiling).
TURN_LIMITS = (
    "budget_turn_tokens",
    "budget_turn_usd",
    "budget_session_tokens",
    "budget_session_usd",
)
#: The operator's alone, never in a turn: the same for every tenant but those its
#: ``tenant_budgets`` names.
OPERATOR_ONLY = ("budget_tenant_tokens", "budget_tenant_usd")
_MILLION = 1_000_000
#: What :class:`BudgetExceeded`'s message begins with, and how it is read back.
_EXCEEDED = re.compile(
    r"budget exceeded: (?P<scope>turn|session|tenant) (?P<unit>tokens|usd) "
    r"spent (?P<spent>[0-9.]+) of limit (?P<limit>[0-9.]+)"
)


@dataclass(frozen=True)
class Limit:
    scope: str  # turn | session | tenant
    unit: str  # tokens | usd
    value: float
    #: The operator's entry the tenant's limit came from (DURABLE_HARNESS_TENANT_BUDGETS),
    #: None for the defaults.
    tenant_entry: str | None = None

    @property
    def setting(self) -> str:
        return f"budget_{self.scope}_{self.unit}"


@dataclass(frozen=True)
class Spend:
    tokens: int = 0
    usd: float = 0.0
    lost_calls: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.tokens + other.tokens, self.usd + other.usd, self.lost_calls + other.lost_calls
        )

    def of(self, unit: str) -> float:
        return self.tokens if unit == "tokens" else self.usd


def spent_by(steps: Iterable[Step], prices: PriceTable, max_tokens: int) -> Spend:
    """What a turn's steps spent (see the module's text); tool steps spend nothing."""
    total = Spend()
    before = 0  # the tokens of the turn's latest finished model step so far
    for step in sorted(steps, key=lambda s: s.seq):
        if step.kind != "model":
            continue
        done = step.status is not StepStatus.INTENT
        lost = step.attempts - 1 if done else step.attempts
        price = prices.price(step_model(step))
        used = sum(tokens(step, key) for key in TOKEN_KEYS) if done else 0
        usd = 0.0
        if price is not None:
            usd = price.cost(step.meta) if done else 0.0
            usd += lost * (before * price.input + max_tokens * price.output) / _MILLION
        total += Spend(used + lost * (before + max_tokens), usd, lost)
        if done:
            before = used
    return total


@dataclass(frozen=True)
class Budget:
    """One turn's limits and where its session's and tenant's spend is read."""

    world: World
    turn_id: str
    session_id: str
    tenant: str | None
    limits: tuple[Limit, ...]
    prices: PriceTable
    lost_call_tokens: int

    @classmethod
    def of(
        cls,
        world: World,
        turn_id: str,
        session_id: str,
        config: Mapping[str, Any],
        operator: Settings,
    ) -> Budget:
        """The limits of an admitted turn configuration (its ``budget_*`` values are at
        most the operator's), and the tenant's from the operator's settings."""
        values = {name: config.get(name) for name in TURN_LIMITS}
        values |= {name: getattr(operator, name) for name in OPERATOR_ONLY}
        tenant = world.get_owner("turn", turn_id)
        entry = operator.tenant_budgets.get(tenant) if tenant is not None else None
        overridden: set[str] = set()
        for unit in UNITS if entry is not None else ():
            if getattr(entry, unit) is not None:
                values[f"budget_tenant_{unit}"] = getattr(entry, unit)
                overridden.add(unit)
        limits = tuple(
            Limit(
                scope,
                unit,
                float(value),
                tenant if scope == "tenant" and unit in overridden else None,
            )
            for scope in SCOPES
            for unit in UNITS
            if (value := values.get(f"budget_{scope}_{unit}")) is not None
            and (scope != "tenant" or tenant is not None)
        )
        max_tokens = config.get("max_tokens")
        lost = max_tokens if isinstance(max_tokens, int) else operator.max_tokens
        return cls(world, turn_id, session_id, tenant, limits, operator.price_table(), lost)

    def check(self, own: Iterable[Step], model: str) -> None:
        """Raise :class:`BudgetExceeded` if a limit is reached (the call must not be
        made), TurnFailed if a USD limit is in force and ``model`` has no price."""
        if not self.limits:
            return
        mine = spent_by(own, self.prices, self.lost_call_tokens)
        spent = {"turn": mine}
        scopes = {limit.scope for limit in self.limits}
        if "session" in scopes:
            turns = [t.turn_id for t in self.world.list_turns(self.session_id, limit=2**31)]
            spent["session"] = mine + self._others(turns)
        if "tenant" in scopes and self.tenant is not None:
            spent["tenant"] = mine + self._others(self._tenant_turns(self.tenant))
        for limit in self.limits:
            used = spent[limit.scope].of(limit.unit)
            if used >= limit.value:
                raise BudgetExceeded(exceeded_message(limit, spent[limit.scope]))
        usd = [limit for limit in self.limits if limit.unit == "usd"]
        if usd and self.prices.price(model) is None:
            raise TurnFailed(
                f"budget: model {model!r} has no price, so the {usd[0].scope}'s USD limit "
                "cannot be kept; price it (DURABLE_HARNESS_PRICES) or use a token limit"
            )

    def _others(self, turn_ids: Iterable[str]) -> Spend:
        total = Spend()
        for turn_id in turn_ids:
            if turn_id != self.turn_id:
                total += _FINISHED.spend(self, turn_id)
        return total

    def _tenant_turns(self, tenant: str) -> list[str]:
        ids: list[str] = []
        before: tuple[float, str] | None = None
        while True:
            page = self.world.list_owned(tenant, "turn", limit=500, before=before)
            ids += [item_id for _, item_id in page]
            if len(page) < 500:
                return ids
            before = page[-1]


def exceeded_message(limit: Limit, spent: Spend) -> str:
    shown = f"{int(spent.tokens)}" if limit.unit == "tokens" else f"{spent.usd:.6f}"
    cap = f"{int(limit.value)}" if limit.unit == "tokens" else f"{limit.value:.6f}"
    how = (
        f"the operator's DURABLE_HARNESS_TENANT_BUDGETS entry of tenant {limit.tenant_entry!r}"
        if limit.tenant_entry is not None
        else "the operator's DURABLE_HARNESS_BUDGET_TENANT_" + limit.unit.upper()
        if limit.scope == "tenant"
        else f"a new turn of the session with a higher --{limit.setting.replace('_', '-')} "
        f"(at most the worker's DURABLE_HARNESS_{limit.setting.upper()})"
    )
    return (
        f"budget exceeded: {limit.scope} {limit.unit} spent {shown} of limit {cap} "
        f"({spent.lost_calls} call(s) counted as lost to a crash); the next model call "
        f"was not made. To go on: {how}"
    )


def exceeded_of(error: str | None) -> dict[str, Any] | None:
    """``{"scope", "unit", "spent", "limit"}`` of a turn ended by a budget (its error),
    else None."""
    found = _EXCEEDED.match(error or "")
    if found is None:
        return None
    number = int if found["unit"] == "tokens" else float
    return {
        "scope": found["scope"],
        "unit": found["unit"],
        "spent": number(float(found["spent"])),
        "limit": number(float(found["limit"])),
    }


class _FinishedTurns:
    """Per World, the spend of finished turns (they never change), bounded."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._by_world: weakref.WeakKeyDictionary[World, OrderedDict[tuple[Any, ...], Spend]]
        self._by_world = weakref.WeakKeyDictionary()

    def spend(self, budget: Budget, turn_id: str) -> Spend:
        key = (turn_id, id(budget.prices), budget.lost_call_tokens)
        with self._lock:
            known = self._by_world.setdefault(budget.world, OrderedDict())
            if key in known:
                known.move_to_end(key)
                return known[key]
        try:
            finished = budget.world.get_turn(turn_id).status in FINISHED
        except NotFound:  # owned, but its creation never finished: nothing spent
            return Spend()
        # Status first, steps second: a turn seen finished has all its steps written.
        steps = budget.world.load_steps(turn_id)
        spent = spent_by(steps, budget.prices, budget.lost_call_tokens)
        if finished:
            with self._lock:
                known[key] = spent
                while len(known) > self.size:
                    known.popitem(last=False)
        return spent


_FINISHED = _FinishedTurns()
