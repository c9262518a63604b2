"""The price table (core/pricing.py): exact name, then a dated snapshot of one; the operator's file
merged over the default; a bad file a ConfigError when the settings load; a model
without a price costs None, never 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.core.pricing import DEFAULT_PRICES, Price, PriceTable, price_table, read_prices
from durable_harness.core.settings import Settings

MILLION = {"input_tokens": 1_000_000}


def test_exact_name_then_longest_prefix() -> None:
    table = price_table()
    sonnet = DEFAULT_PRICES["claude-sonnet-4-5"]
    assert table.price("claude-sonnet-4-5") == sonnet
    assert table.price("claude-sonnet-4-5-20250929") == sonnet  # a dated snapshot
    # A dated snapshot costs what its model does ("gpt-5-mini", not "gpt-5").
    assert table.price("gpt-5-mini-2025-08-07") == DEFAULT_PRICES["gpt-5-mini"]
    assert table.price("gpt-5-2025-08-07") == DEFAULT_PRICES["gpt-5"]
    own = PriceTable({"a": Price(1, 1, 1, 1), "ab": Price(2, 2, 2, 2), "abc": Price(3, 3, 3, 3)})
    assert own.price("ab-2026-01-01") == Price(2, 2, 2, 2)
    assert own.price("ab-latest") == Price(2, 2, 2, 2)
    assert own.price("abc") == Price(3, 3, 3, 3)
    assert own.price("abd") is None  # another model, not a snapshot of "ab"
    assert own.price("ba") is None
    # Longer names of other models are not priced as the shorter one.
    for other in ("o3-pro", "o3-deep-research", "gpt-5.2", "claude-opus-4-6"):
        assert table.price(other) is None, other
    assert table.price("gpt-4o-2024-05-13") != DEFAULT_PRICES["gpt-4o"]


def test_a_cost_from_the_four_counts() -> None:
    table = price_table()
    meta = {
        "input_tokens": 1000,
        "output_tokens": 500,
        "cache_read_tokens": 10_000,
        "cache_write_tokens": 2000,
    }
    # Sonnet 4.5: $3 in, $15 out, $0.30 cache read, $3.75 cache write per million.
    expected = (1000 * 3 + 500 * 15 + 10_000 * 0.3 + 2000 * 3.75) / 1e6
    assert table.cost("claude-sonnet-4-5", meta) == pytest.approx(expected)
    assert table.cost("claude-sonnet-4-5", {}) == 0.0  # a priced call that reported nothing
    # A count that is not an int (a provider's odd usage) counts as none.
    assert table.cost("claude-sonnet-4-5", {"input_tokens": "many", "output_tokens": True}) == 0


def test_a_model_without_a_price_costs_none_not_zero() -> None:
    table = price_table()
    assert table.price("some-local-llama") is None
    assert table.cost("some-local-llama", MILLION) is None
    assert table.cost(None, MILLION) is None
    assert table.cost("", MILLION) is None


def test_the_operators_file_is_merged_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps(
            {
                "claude-sonnet-4-5": {"input": 1, "output": 2, "cache_read": 0.5, "cache_write": 1},
                "my-gateway": {"input": 0.5, "output": 1.5},
                "gpt-4o": None,
            }
        )
    )
    table = price_table(path)
    assert table.price("claude-sonnet-4-5-20250929") == Price(1, 2, 0.5, 1)
    # cache prices not given are the input price
    assert table.price("my-gateway-20260101") == Price(0.5, 1.5, 0.5, 0.5)
    # null: no price for that name, nor for its dated snapshots
    assert table.cost("gpt-4o", MILLION) is None
    assert table.cost("gpt-4o-2024-08-06", MILLION) is None
    assert table.price("gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert table.price("claude-haiku-4-5") == DEFAULT_PRICES["claude-haiku-4-5"]  # kept


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "must hold one JSON object"),
        ('{"m": {"input": 1}}', "m.output: Field required"),
        ('{"m": {"input": -1, "output": 1}}', "m.input: Input should be greater than"),
        ('{"m": {"input": 1, "output": 1, "cache_reads": 1}}', "m.cache_reads: Extra inputs"),
        ('{"m": {"input": "cheap", "output": 1}}', "m.input: Input should be a valid number"),
        (b"\xff\xfe", "is not JSON"),
    ],
)
def test_a_bad_file_is_a_config_error_naming_it(
    tmp_path: Path, content: str | bytes, needle: str
) -> None:
    path = tmp_path / "prices.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_prices(path)
    message = str(caught.value)
    assert str(path) in message and "DURABLE_HARNESS_PRICES" in message
    assert needle in message, message


def test_settings_read_the_file_when_they_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"house-model": {"input": 4, "output": 8}}')
    monkeypatch.setenv("DURABLE_HARNESS_PRICES", str(path))
    assert Settings.load().price_table().cost("house-model", MILLION) == 4.0
    path.write_text('{"house-model": {"input": 4}}')
    with pytest.raises(ConfigError, match=r"house-model\.output"):
        Settings.load()
    monkeypatch.setenv("DURABLE_HARNESS_PRICES", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="cannot read the price file"):
        Settings.load()


def test_a_command_with_a_bad_file_stops_at_start(tmp_path: Path) -> None:
    """`ls` (as every command) refuses to start, with the file named, and no traceback."""
    path = tmp_path / "prices.json"
    path.write_text("[]")
    out = subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", "ls", "--data-dir", str(tmp_path / "w")],
        env={"DURABLE_HARNESS_PRICES": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert str(path) in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "w").exists()  # refused before the World was opened
