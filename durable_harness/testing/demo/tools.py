"""Demo host tools: a refund API whose side effect lands in a ledger file.

``refund`` is ``never``: a second run would refund twice. ``check_refund`` is ``safe``: it
only reads. The ledger (``DURABLE_HARNESS_DEMO_LEDGER``, default ``refund-ledger.txt``) is
outside the workspace, like a payment provider's database, so the journal cannot undo it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from durable_harness.harness.tools import Tool, ToolContext, tool


class Order(BaseModel):
    order: int


def ledger() -> Path:
    return Path(os.environ.get("DURABLE_HARNESS_DEMO_LEDGER", "refund-ledger.txt"))


def refunded(order: int) -> list[str]:
    path = ledger()
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith(f"order {order} ")]


@tool(replay="safe")
def check_refund(args: Order) -> str:
    """Look up whether an order has been refunded."""
    found = refunded(args.order)
    if found:
        return f"order {args.order}: already refunded ({len(found)} refund(s) on record)"
    return f"order {args.order}: not refunded"


def _refund(args: Order, ctx: ToolContext) -> str:
    # A real payment API would take ctx.idempotency_key and deduplicate on it; this one
    # appends blindly so that a repeated call is visible.
    with ledger().open("a") as f:
        f.write(f"order {args.order} refunded key={ctx.idempotency_key}\n")
        f.flush()
        os.fsync(f.fileno())
    return f"refund issued for order {args.order}"


refund = tool(replay="never", name="refund", description="Refund an order (moves money).")(_refund)

#: What `--tools durable_harness/testing/demo/tools.py:TOOLS` loads.
TOOLS: list[Tool] = [check_refund, refund]

#: The same refund wrongly labelled safe: the crash matrix shows the double refund.
TOOLS_REFUND_MARKED_SAFE: list[Tool] = [
    check_refund,
    tool(replay="safe", name="refund", description="Refund an order (moves money).")(_refund),
]
