"""What a turn (and a session) cost, and what its journal saved, from the World alone.

* A model step's cost is its recorded usage (:mod:`durable_harness.core.usage`) priced
  by the table (:mod:`durable_harness.core.pricing`) for the model it recorded; a step
  whose model has no price costs None, and so does every tool step (no tokens).
* A turn's ``cost_usd`` sums its model steps' costs: what the provider billed for the
  calls the journal holds. None when no model step has a price (unknown is not free).
  A call made again after a crash (it had returned, but its outcome was not recorded)
  is billed twice by the provider and counted once here: the journal keeps one outcome.
* Savings: every ``step.replayed`` event of a model step (one per step and delivery,
  appended by the journal when a later delivery reads the finished call back instead
  of paying for it again) saves that step's cost once, unless the delivery before it
  parked the turn on a wait (``after`` ``woken``): a woken turn reads its calls back
  every time, and without the journal the wait itself would not exist, so that is no
  crash's saving. ``saved_model_calls`` counts them, ``saved_usd`` sums their costs (None
  when calls were saved but none has a price).

The counts are computed when asked (``show``, ``ls``, the API), so a corrected price
table prices past turns too; the cost is that of reading the turn's steps, and the events
of its log this process has not read yet (:class:`_SavedIndex`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from durable_harness.core import events as ev
from durable_harness.core.pricing import PriceTable, step_cost, tokens
from durable_harness.core.types import Event, Step
from durable_harness.core.usage import TOKEN_KEYS
from durable_harness.core.world import World
from durable_harness.harness.events import read_all

#: ``step.replayed``'s ``after`` values that are no saving (see the module's text).
NOT_SAVED = frozenset({"woken"})


@dataclass(frozen=True)
class Costs:
    """Tokens, money and savings of a turn or of several (a session)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    saved_model_calls: int = 0
    saved_usd: float | None = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __add__(self, other: Costs) -> Costs:
        return Costs(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            _add(self.cost_usd, other.cost_usd),
            self.saved_model_calls + other.saved_model_calls,
            self._saved_plus(other),
        )

    def _saved_plus(self, other: Costs) -> float | None:
        # A side that saved no call adds nothing, not even its 0.0: the sum of one turn
        # whose saved calls have no price and one that saved none is unknown, not 0.
        mine = self.saved_usd if self.saved_model_calls else None
        theirs = other.saved_usd if other.saved_model_calls else None
        total = _add(mine, theirs)
        return (
            0.0
            if total is None and not (self.saved_model_calls or other.saved_model_calls)
            else total
        )


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


def turn_costs(
    world: World,
    turn_id: str,
    prices: PriceTable,
    steps: Sequence[Step] | None = None,
    events: Sequence[Event] | None = None,
) -> Costs:
    """The :class:`Costs` of one turn (``steps`` and ``events``: read now if not given)."""
    steps = world.load_steps(turn_id) if steps is None else steps
    saved = _SAVED.of(world, turn_id) if events is None else _saved_in(events)
    costs = {s.seq: step_cost(s, prices) for s in steps}
    counts = {key: sum(tokens(s, key) for s in steps) for key in TOKEN_KEYS}
    return Costs(
        **counts,
        cost_usd=_sum(costs.values()),
        saved_model_calls=len(saved),
        saved_usd=_sum(costs.get(seq) for seq in saved) if saved else 0.0,
    )


def session_costs(world: World, session_id: str, prices: PriceTable) -> Costs:
    """The sum of the session's turns' :class:`Costs`."""
    total = Costs()
    for turn in world.list_turns(session_id, limit=2**31):
        total += turn_costs(world, turn.turn_id, prices)
    return total


def _saved_in(events: Iterable[Event]) -> list[int]:
    """The seqs of the model steps read back (once per read-back) that count as saved."""
    return [
        int(e.data["seq"])
        for e in events
        if e.kind == ev.STEP_REPLAYED
        and e.data.get("kind") == "model"
        and "seq" in e.data
        and e.data.get("after") not in NOT_SAVED
    ]


class _SavedIndex:
    """Per World and turn, the saved seqs found so far and the last event seq read.

    A turn's log only grows, by gap-free seqs, and an event never changes: what was read
    stays true, so the next ask reads only the events after it. Without this a viewer
    polling a running turn, or a list asked again, reads every turn's whole log (its text
    deltas too) each time. Bounded per World; a World that is gone takes its entries."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._by_world: weakref.WeakKeyDictionary[World, OrderedDict[str, tuple[int, list[int]]]]
        self._by_world = weakref.WeakKeyDictionary()

    def of(self, world: World, turn_id: str) -> list[int]:
        with self._lock:
            known = self._by_world.setdefault(world, OrderedDict())
            after, saved = known.get(turn_id, (0, []))
        new = read_all(world, turn_id, after)
        saved = saved + _saved_in(new)
        after = new[-1].seq if new else after
        with self._lock:
            known[turn_id] = (after, saved)
            known.move_to_end(turn_id)
            while len(known) > self.size:
                known.popitem(last=False)
        return saved


_SAVED = _SavedIndex()


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None
