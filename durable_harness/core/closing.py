"""``close()`` and context-manager support, for everything that holds a resource.

``with thing:`` returns ``thing`` and closes it on the way out, whatever happened inside;
a subclass overrides :meth:`Closing.close` (and ``__enter__`` when entering starts
something, as a server's or a lease renewal's does).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``close()``, ``__enter__`` (returns self) and ``__exit__`` (calls ``close()``)."""

    def close(self) -> None:
        """Free what the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
