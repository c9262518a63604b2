"""Demo host tools: a refund API whose side effect lands in a ledger file.

``refund`` is ``never``: a second run would refund twice. ``check_refund`` is ``safe``: it
only reads. The ledger (``DURABLE_HARNESS_DEMO_LEDGER``, default ``refund-ledger.txt``) is
outside the workspace, like a payment provider's database, so the journal cannot undo it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from durable_harness.harness.tools import ABSENT, UNKNOWN, Checked, Tool, ToolContext, done, tool


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


def _refund_once(args: Order, ctx: ToolContext) -> str:
    # A payment API that honours the idempotency key: a second call with it changes nothing.
    if not _landed(args.order, ctx):
        _refund(args, ctx)
    return f"refund issued for order {args.order}"


def _landed(order: int, ctx: ToolContext) -> bool:
    return any(line.endswith(f" key={ctx.idempotency_key}") for line in refunded(order))


def _check(args: Order, ctx: ToolContext) -> Checked:
    """Did this step's refund land? Its idempotency key is in the ledger, or it is not."""
    return done(f"refund issued for order {args.order}") if _landed(args.order, ctx) else ABSENT


def _refund_tool(
    check: Callable[[Order, ToolContext], Checked] | None = None, idempotent: bool = False
) -> Tool:
    return tool(
        replay="never",
        name="refund",
        description="Refund an order (moves money).",
        check=check,
        idempotent=idempotent,
    )(_refund_once if idempotent else _refund)


refund = _refund_tool()

#: What `--tools durable_harness/testing/demo/tools.py:TOOLS` loads.
TOOLS: list[Tool] = [check_refund, refund]

#: The same refund wrongly labelled safe: the crash matrix shows the double refund.
TOOLS_REFUND_MARKED_SAFE: list[Tool] = [
    check_refund,
    tool(replay="safe", name="refund", description="Refund an order (moves money).")(_refund),
]

#: The refund with a check that reads the ledger for the step's idempotency key: an
#: interrupted refund that landed is settled with its result, one that did not is
#: *possibly ran* (the ledger does not honour the key, so it may not run again).
TOOLS_CHECKED: list[Tool] = [check_refund, _refund_tool(check=_check)]

#: The same check on a refund whose API honours the key: one that did not land runs again.
TOOLS_CHECKED_IDEMPOTENT: list[Tool] = [check_refund, _refund_tool(check=_check, idempotent=True)]

#: A check that cannot tell: today's *possibly ran*.
TOOLS_CHECK_UNKNOWN: list[Tool] = [check_refund, _refund_tool(check=lambda args, ctx: UNKNOWN)]
