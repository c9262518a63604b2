"""The price table: what a model step cost, in US dollars, from the usage it recorded.

One table, :data:`DEFAULT_PRICES`, in USD per million tokens for the four counts of
:mod:`.usage` (input, output, cache read, cache write), for the models this project's
defaults and docs name (Anthropic's Claude for the built-in agent, Claude Code,
OpenCode and Pi; OpenAI's GPT families for Codex, OpenCode and Pi). A model is found by
its exact name, else as a dated snapshot of a name in the table: the name followed by
``-YYYYMMDD``, ``-YYYY-MM-DD`` or ``-latest`` (``claude-sonnet-4-5-20250929`` costs what
``claude-sonnet-4-5`` does). Any other longer name is another model, priced differently
(``o3-pro`` is not ``o3``, ``gpt-5.2`` not ``gpt-5``): it has no price until the table
names it.
A model the table does not know has **no** price: its cost is None, never 0, so a
missing price shows as unknown rather than as free.

The operator's own table is a JSON file named by ``DURABLE_HARNESS_PRICES``, merged over
the default, one entry per model name (``null``: that name, and its dated snapshots, have
no price)::

    {
      "claude-sonnet-4-5": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75},
      "my-gateway-model": {"input": 0.5, "output": 1.5},
      "gpt-4o": null
    }

``cache_read`` and ``cache_write`` default to the entry's ``input`` price. The file is
read and checked when the settings are loaded (``Settings.prices``): a bad one stops the
command at start with a :class:`ConfigError`, not a request later. Prices are applied when
a cost is read (``show``, ``ls``, the API), so a corrected table corrects past turns too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_harness.core.errors import ConfigError
from durable_harness.core.types import Step

_MILLION = 1_000_000


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, meta: Mapping[str, Any]) -> float:
        """The cost of a step whose meta holds the counts of :mod:`.usage`."""
        total = (
            _count(meta, "input_tokens") * self.input
            + _count(meta, "output_tokens") * self.output
            + _count(meta, "cache_read_tokens") * self.cache_read
            + _count(meta, "cache_write_tokens") * self.cache_write
        )
        return total / _MILLION


def _count(meta: Mapping[str, Any], key: str) -> int:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _p(input: float, output: float, cache_read: float, cache_write: float) -> Price:
    return Price(input, output, cache_read, cache_write)


#: The default table (USD per million tokens: input, output, cache read, cache write),
#: from the providers' published list prices. Anthropic's cache write is its 5-minute
#: write (1.25 x input); OpenAI bills no cache write and reports none.
DEFAULT_PRICES: dict[str, Price] = {
    # Anthropic
    "claude-opus-4-5": _p(5.0, 25.0, 0.5, 6.25),
    "claude-opus-4-1": _p(15.0, 75.0, 1.5, 18.75),
    "claude-opus-4": _p(15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4-5": _p(3.0, 15.0, 0.3, 3.75),
    "claude-sonnet-4": _p(3.0, 15.0, 0.3, 3.75),
    "claude-3-7-sonnet": _p(3.0, 15.0, 0.3, 3.75),
    "claude-3-5-sonnet": _p(3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": _p(1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku": _p(0.8, 4.0, 0.08, 1.0),
    "claude-3-haiku": _p(0.25, 1.25, 0.03, 0.3),
    # OpenAI
    "gpt-5": _p(1.25, 10.0, 0.125, 0.0),
    "gpt-5-codex": _p(1.25, 10.0, 0.125, 0.0),
    "gpt-5-mini": _p(0.25, 2.0, 0.025, 0.0),
    "gpt-5-nano": _p(0.05, 0.4, 0.005, 0.0),
    "gpt-5-pro": _p(15.0, 120.0, 15.0, 0.0),
    "gpt-5.1": _p(1.25, 10.0, 0.125, 0.0),
    "gpt-5.1-codex": _p(1.25, 10.0, 0.125, 0.0),
    "gpt-5.1-codex-mini": _p(0.25, 2.0, 0.025, 0.0),
    "gpt-4.1": _p(2.0, 8.0, 0.5, 0.0),
    "gpt-4.1-mini": _p(0.4, 1.6, 0.1, 0.0),
    "gpt-4.1-nano": _p(0.1, 0.4, 0.025, 0.0),
    "gpt-4o": _p(2.5, 10.0, 1.25, 0.0),
    "gpt-4o-2024-05-13": _p(5.0, 15.0, 5.0, 0.0),  # the first snapshot: its own price
    "gpt-4o-mini": _p(0.15, 0.6, 0.075, 0.0),
    "o3": _p(2.0, 8.0, 0.5, 0.0),
    "o3-mini": _p(1.1, 4.4, 0.55, 0.0),
    "o4-mini": _p(1.1, 4.4, 0.275, 0.0),
}


#: A dated snapshot of a model: its name, then a date or ``latest``.
SNAPSHOT = re.compile(r"(.+?)-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)")


class PriceTable:
    """Model name -> :class:`Price`, by exact name, then as a dated snapshot of one."""

    def __init__(self, prices: Mapping[str, Price | None]) -> None:
        self.prices = dict(prices)

    def price(self, model: str | None) -> Price | None:
        if not model:
            return None
        if model in self.prices:
            return self.prices[model]
        snapshot = SNAPSHOT.fullmatch(model)
        if snapshot is not None:
            return self.prices.get(snapshot.group(1))
        return None

    def cost(self, model: str | None, meta: Mapping[str, Any]) -> float | None:
        """The cost of one model step (None: the model has no price here)."""
        price = self.price(model)
        return None if price is None else price.cost(meta)


class _PriceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)

    def price(self) -> Price:
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        return Price(self.input, self.output, read, write)


class _PriceFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    entries: dict[str, _PriceEntry | None]


def step_cost(step: Step, prices: PriceTable) -> float | None:
    """The cost of one step (None: a tool step, or a model whose price is unknown)."""
    if step.kind != "model":
        return None
    return prices.cost(step_model(step), step.meta)


def step_model(step: Step) -> str:
    """The model a model step used. An older journal's step recorded no ``model``: its
    name is the request's model."""
    model = step.meta.get("model")
    return model if isinstance(model, str) and model else step.name


def tokens(step: Step, key: str) -> int:
    """One of :mod:`.usage`'s counts recorded by a step (0 when it has none)."""
    return _count(step.meta, key)


def read_prices(path: Path) -> dict[str, Price | None]:
    """The operator's price file (``None``: no price). ConfigError naming the file and
    what is wrong with it."""
    where = f"the price file {path} (DURABLE_HARNESS_PRICES)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} must hold one JSON object of model name -> "
            '{"input": ..., "output": ..., "cache_read": ..., "cache_write": ...} '
            "(USD per million tokens)"
        )
    try:
        parsed = _PriceFile(entries=data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{where}: {problems}") from exc
    return {
        name: None if entry is None else entry.price() for name, entry in parsed.entries.items()
    }


def price_table(path: Path | None = None) -> PriceTable:
    """The default table, with the operator's file (if any) merged over it."""
    prices: dict[str, Price | None] = dict(DEFAULT_PRICES)
    if path is not None:
        prices.update(read_prices(path))
    return PriceTable(prices)
