"""Crash injection: kill the process at an exact point of an exact step.

``DURABLE_HARNESS_CRASH_AT=<seq>:<point>[,<seq>:<point>…]`` makes the process exit at once
with ``os._exit`` (no cleanup, no flush of anything but our own message, no lease release:
what a SIGKILL or an OOM kill leaves behind) when step ``seq`` reaches ``point``:

* ``before_intent``: nothing recorded yet;
* ``after_intent``: the intent is committed, the call has not run;
* ``after_run``: the call returned, its outcome is not recorded;
* ``after_outcome``: the outcome is recorded.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal, get_args

from durable_harness.core.errors import ConfigError

CrashPoint = Literal["before_intent", "after_intent", "after_run", "after_outcome"]
CRASH_POINTS: tuple[str, ...] = get_args(CrashPoint)
CRASH_EXIT_CODE = 86
ENV_VAR = "DURABLE_HARNESS_CRASH_AT"


@dataclass(frozen=True)
class CrashPlan:
    points: frozenset[tuple[int, str]]

    @classmethod
    def parse(cls, text: str) -> CrashPlan:
        points: set[tuple[int, str]] = set()
        for item in filter(None, (part.strip() for part in text.split(","))):
            seq_text, _, point = item.partition(":")
            if not seq_text.isdigit() or point not in CRASH_POINTS:
                raise ConfigError(
                    f"{ENV_VAR}={text!r}: expected <seq>:<point> with point one of "
                    f"{', '.join(CRASH_POINTS)}"
                )
            points.add((int(seq_text), point))
        return cls(frozenset(points))

    @classmethod
    def from_env(cls) -> CrashPlan | None:
        text = os.environ.get(ENV_VAR, "")
        return cls.parse(text) if text.strip() else None

    def check(self, seq: int, point: CrashPoint) -> None:
        if (seq, point) in self.points:
            sys.stderr.write(f"durable-harness: crash injected at step {seq} {point}\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
