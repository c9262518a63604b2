"""The list routes' filters (``status``, ``q``) and the keyset paging that stays correct
under them.

A page is newest first by ``(created_at, id)``; its cursor is the key the next page
starts after. Unfiltered, a page is the next ``limit`` keys. Filtered, the matching items
may be sparse, so a page reads further keys until it holds ``limit`` matches and one
more (that one only says whether more follow), the keys run out, or it has examined
``scan`` keys (``DURABLE_HARNESS_API_LIST_SCAN``, 1000): then it ends early, possibly
short or empty, with the last examined key as its cursor. One request so never reads
more than ``scan`` items, however few match, and a client that follows the cursors still
sees every match exactly once, in order. ``next_cursor`` null means the end.

A dead-lettered turn is ``failed`` with an error the World wrote when it gave up on the
turn: every backend spells it ``dead-lettered ...`` (after N deliveries, or by SQS's
redrive policy). Nothing else marks it (no field of its own), and no other writer of a
turn's error starts with those words: the error of a turn the worker fails is a harness
message or the agent's exception text. ``status=failed`` lists every failed turn, the
dead-lettered ones too; ``status=dead`` only those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from durable_harness.core.types import Session, Turn, TurnStatus
from durable_harness.server.errors import ApiError

#: Keys read from the World at a time while filling a filtered page.
BATCH = 100
DEAD = "dead"
STATUSES = (*(s.value for s in TurnStatus), DEAD)
#: The error a World records when it dead-letters a turn starts with this.
DEAD_LETTER_PREFIX = "dead-lettered "

Key = tuple[float, str]
#: What a page reads keys from: ``(before, n)`` to at most ``n`` keys after ``before``.
Keys = Callable[[Key | None, int], list[Key]]
T = TypeVar("T")


def is_dead_lettered(turn: Turn) -> bool:
    return turn.status is TurnStatus.FAILED and (turn.error or "").startswith(DEAD_LETTER_PREFIX)


def status_filter(status: str | None) -> Callable[[Turn], bool] | None:
    """What ``?status=`` keeps (None: every turn); 422 for a status no turn has."""
    if status is None or status == "":
        return None
    if status not in STATUSES:
        raise ApiError(
            422,
            f"status {status!r} is not one of {', '.join(STATUSES)} "
            "(dead: failed by dead-lettering)",
            "unknown_status",
        )
    if status == DEAD:
        return is_dead_lettered
    wanted = TurnStatus(status)
    return lambda turn: turn.status is wanted


def text_filter(q: str | None) -> Callable[[Iterable[str | None]], bool] | None:
    """Whether any of some texts holds ``q``, case-insensitively (None: no ``?q=``)."""
    if not q:
        return None
    needle = q.casefold()
    return lambda texts: any(needle in t.casefold() for t in texts if t)


def turn_filter(status: str | None, q: str | None) -> Callable[[Turn], bool] | None:
    """``status`` and ``q`` (in the prompt, turn id or session id) together."""
    by_status = status_filter(status)
    by_text = text_filter(q)
    if by_status is None and by_text is None:
        return None

    def keep(turn: Turn) -> bool:
        if by_status is not None and not by_status(turn):
            return False
        return by_text is None or by_text((turn.prompt, turn.turn_id, turn.session_id))

    return keep


def session_filter(
    q: str | None, turns_of: Callable[[str], list[Turn]]
) -> Callable[[Session], bool] | None:
    """``q`` in the session's id, its agent, or the prompt or id of any of its turns."""
    by_text = text_filter(q)
    if by_text is None:
        return None

    def keep(session: Session) -> bool:
        agent = session.meta.get("agent")
        if by_text((session.session_id, agent if isinstance(agent, str) else None)):
            return True
        return any(by_text((t.prompt, t.turn_id)) for t in turns_of(session.session_id))

    return keep


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: Key | None


def page(
    keys: Keys,
    load: Callable[[str], T | None],
    keep: Callable[[T], bool] | None,
    limit: int,
    before: Key | None,
    scan: int,
) -> Page[T]:
    """One page of the items ``keys`` lists (newest first, after ``before``, at most
    ``n`` a call), as ``load`` reads them (None: listed, but its creation never
    finished: skipped), those ``keep`` keeps (None: all), examining at most ``scan``
    keys when ``keep`` filters. See the module docstring."""
    found: list[tuple[Key, T]] = []
    cursor = before
    examined = 0
    exhausted = False
    cap = scan if keep is not None else None
    while len(found) <= limit:
        want = max(BATCH, limit + 1 - len(found))
        if cap is not None:
            want = min(want, cap - examined)
            if want <= 0:
                break
        batch = keys(cursor, want)
        for key in batch:
            examined += 1
            cursor = key
            item = load(key[1])
            if item is not None and (keep is None or keep(item)):
                found.append((key, item))
                if len(found) > limit:
                    break
        if len(batch) < want:
            exhausted = True
            break
    shown = found[:limit]
    if len(found) > limit:
        return Page([item for _, item in shown], shown[-1][0])
    if exhausted:
        return Page([item for _, item in shown], None)
    return Page([item for _, item in shown], cursor)  # the scan cap: go on from here
