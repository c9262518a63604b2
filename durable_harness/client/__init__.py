"""A Python client of ``durable-harness serve`` (docs/api.md), on httpx2.

::

    from durable_harness.client import Client

    with Client("http://127.0.0.1:8788", token) as api:
        session = api.create_session(agent="builtin")
        started = api.start_turn(session.session_id, "add a pricing page")
        for event in api.events(started.turn_id):      # reconnects by itself
            if event.kind == "text.delta":
                print(event.data["text"], end="")
        print(api.get_turn(started.turn_id).reply)

Every call returns a typed result or raises :class:`ApiError` (the HTTP status, the
API's error code and message; status 0 when the server could not be reached).
:meth:`Client.events` yields each event of a turn once, in order, and ends after
``turn.ended``: across a dropped connection or a ``serve`` restart it reconnects with
``Last-Event-ID`` after a growing pause, and gives up (:class:`ApiError`) after
``retries`` attempts in a row that brought no event.

This package imports only the bottom layer (``core``): an app needs no World, worker or
agent code to talk to ``serve``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any, Generic, Self, TypeVar

import httpx2

from durable_harness.core.closing import Closing
from durable_harness.core.events import TURN_ENDED

__all__ = [
    "ApiError",
    "Client",
    "Page",
    "SessionInfo",
    "StreamEvent",
    "TurnInfo",
    "TurnStarted",
]

T = TypeVar("T")


class ApiError(Exception):
    """A request ``serve`` refused (``status``, ``code``, ``message``), or could not be
    made (``status`` 0, ``code`` ``unreachable``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    created_at: float
    agent: str | None
    workspace: str | None
    tools: list[str]
    tenant: str | None
    # Tokens, cost and savings of its turns (docs/costs.md); defaults: an older server.
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    saved_model_calls: int = 0
    saved_usd: float | None = None


@dataclass(frozen=True)
class TurnStarted:
    turn_id: str
    session_id: str
    index: int
    status: str
    events: str


@dataclass(frozen=True)
class TurnInfo:
    turn_id: str
    session_id: str
    index: int
    status: str
    prompt: str
    reply: str | None
    error: str | None
    waiting_for: str | None
    attempts: int
    created_at: float
    finished_at: float | None
    steps: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    cache_read_tokens: int = 0  # these four: defaults for an older server (docs/costs.md)
    cache_write_tokens: int = 0
    saved_model_calls: int = 0
    saved_usd: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; pass ``next_cursor`` back for the next (None: the last)."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class StreamEvent:
    """One event of a turn's log: ``seq`` 1, 2, 3, ... (the SSE id), ``kind`` (core/events.py)."""

    seq: int
    kind: str
    data: dict[str, Any]
    at: float


def _typed(cls: type[T], data: dict[str, Any]) -> T:
    """A result type from a response object (fields a newer server adds are ignored)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


class Client(Closing):
    """The API's calls (see the module docstring). ``timeout``: seconds per request
    (a stream's read waits up to ``stream_timeout`` between bytes: the server sends a
    heartbeat every 15 s, so a silent connection is a dead one)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        stream_timeout: float = 45.0,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stream_timeout = stream_timeout
        self._http = httpx2.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    # -- resources -------------------------------------------------------------------
    def create_session(
        self,
        agent: str = "builtin",
        *,
        workspace: str | None = None,
        repo: str | None = None,
        tools: list[str] | None = None,
    ) -> SessionInfo:
        body: dict[str, Any] = {"agent": agent, "tools": tools or []}
        if workspace is not None:
            body["workspace"] = workspace
        if repo is not None:
            body["repo"] = repo
        return _typed(SessionInfo, self._call("POST", "/v1/sessions", json=body))

    def get_session(self, session_id: str) -> SessionInfo:
        return _typed(SessionInfo, self._call("GET", f"/v1/sessions/{session_id}"))

    def list_sessions(self, limit: int = 50, cursor: str | None = None) -> Page[SessionInfo]:
        data = self._call("GET", "/v1/sessions", params=_page(limit, cursor))
        return Page([_typed(SessionInfo, s) for s in data["sessions"]], data["next_cursor"])

    def start_turn(self, session_id: str, prompt: str) -> TurnStarted:
        data = self._call("POST", f"/v1/sessions/{session_id}/turns", json={"prompt": prompt})
        return _typed(TurnStarted, data)

    def get_turn(self, turn_id: str) -> TurnInfo:
        return _typed(TurnInfo, self._call("GET", f"/v1/turns/{turn_id}"))

    def list_turns(
        self, session_id: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[TurnInfo]:
        """A session's turns in order, or (no session) the caller's turns newest first."""
        path = f"/v1/sessions/{session_id}/turns" if session_id else "/v1/turns"
        data = self._call("GET", path, params=_page(limit, cursor))
        return Page([_typed(TurnInfo, t) for t in data["turns"]], data["next_cursor"])

    def fork(self, turn_id: str, at: int, prompt: str = "") -> TurnStarted:
        """A new session continuing the turn from before step ``at``, its first turn
        queued with ``prompt`` (docs/fork.md); the original is not changed."""
        data = self._call("POST", f"/v1/turns/{turn_id}/fork", json={"at": at, "prompt": prompt})
        return _typed(TurnStarted, data)

    def cancel(self, turn_id: str, reason: str = "cancelled through the API") -> bool:
        """Ask for the turn to be cancelled; False if it had already finished."""
        data = self._call("POST", f"/v1/turns/{turn_id}/cancel", json={"reason": reason})
        return bool(data["requested"])

    def signal(
        self, turn_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> bool:
        """Send a signal (it wakes the turn's wait for it); False if it was a repeat."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        data = self._call(
            "POST",
            f"/v1/turns/{turn_id}/signals/{name}",
            content=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        return bool(data["new"])

    def wait(self, turn_id: str, timeout: float = 300.0, poll: float = 0.5) -> TurnInfo:
        """Poll until the turn is finished (its stream is the cheaper way to follow it)."""
        deadline = time.monotonic() + timeout
        while True:
            turn = self.get_turn(turn_id)
            if turn.finished or time.monotonic() > deadline:
                return turn
            time.sleep(poll)

    # -- the event stream ------------------------------------------------------------
    def events(
        self,
        turn_id: str,
        after: int = 0,
        *,
        retries: int = 10,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
    ) -> Iterator[StreamEvent]:
        """The turn's events after seq ``after``, each once and in order, ending after
        ``turn.ended``; reconnects by itself (see the module docstring). A refusal that
        a retry cannot change (401, 404, another 4xx) is raised at once."""
        last = after
        failures = 0
        while True:
            progressed = False
            try:
                for event in self._stream_once(turn_id, last):
                    if event is None:
                        return
                    if event.seq != last + 1:
                        # Never from a sound server; reading again from ``last`` repairs it.
                        break
                    last = event.seq
                    progressed = True
                    yield event
                    if event.kind == TURN_ENDED:
                        return
                else:
                    # The server ends a stream after its lifetime (API_STREAM_MAX_S): a clean
                    # end is not a failure; the next request resumes from ``last``.
                    progressed = True
                problem = "the stream ended before turn.ended"
            except ApiError as exc:
                if exc.status and exc.status < 500 and exc.status not in (408, 429):
                    raise
                problem = str(exc)
            except httpx2.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            failures = 0 if progressed else failures + 1
            if failures > retries:
                raise ApiError(
                    0,
                    "unreachable",
                    f"gave up on turn {turn_id}'s events after {retries} reconnects "
                    f"without an event (last: {problem}); call events(after={last}) to go on",
                )
            time.sleep(min(max_backoff, backoff * 2 ** max(failures - 1, 0)))

    def _stream_once(self, turn_id: str, after: int) -> Iterator[StreamEvent | None]:
        """One connection's events; None: the server says the stream is over (204)."""
        headers = {"Last-Event-ID": str(after)}
        timeout = httpx2.Timeout(self._http.timeout.connect, read=self.stream_timeout)
        with self._http.sse(
            f"/v1/turns/{turn_id}/events", headers=headers, timeout=timeout
        ) as source:
            response = source.response
            if response.status_code == 204:
                yield None  # the turn ended and every event is had: no stream, no retry
                return
            if response.status_code != 200:
                response.read()
                raise _error(response)
            for sse in source:
                if not sse.id:
                    continue
                data = json.loads(sse.data)
                yield StreamEvent(int(data["seq"]), str(data["kind"]), data["data"], data["at"])

    # -- plumbing --------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx2.TransportError as exc:
            raise ApiError(0, "unreachable", f"{self.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise _error(response)
        return response.json()


def _page(limit: int, cursor: str | None) -> dict[str, Any]:
    return {"limit": limit, **({"cursor": cursor} if cursor else {})}


def _error(response: httpx2.Response) -> ApiError:
    try:
        error = response.json()["error"]
        return ApiError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        text = response.text[:200] or response.reason_phrase
        return ApiError(response.status_code, "http_error", text)
