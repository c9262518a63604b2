"""A scripted fake Anthropic model server, speaking the Messages API over real HTTP.

The demo and the tests use it instead of a provider, and agent CLIs reach it through the
journaling proxy, so it answers the way Anthropic does, streaming included:

* ``POST /v1/messages`` (query string ignored): a JSON message, or with ``"stream": true``
  a ``text/event-stream`` of ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` (``text_delta`` / ``input_json_delta`` pieces),
  ``content_block_stop``, ``message_delta``, ``message_stop``, each event flushed.
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.
* ``POST /v1/responses``: the OpenAI Responses API from the same script (JSON, or
  streamed ``response.*`` events ending in ``response.completed``; errors OpenAI-shaped),
  see :mod:`~durable_harness.testing.fake_model_responses`.
* ``POST /v1/chat/completions``: the OpenAI Chat Completions API from the same script
  (JSON, or streamed ``data:`` chunks ending in ``data: [DONE]``; errors OpenAI-shaped),
  see :mod:`~durable_harness.testing.fake_model_chat`.
* ``GET /_fake/stats``: ``{"requests", "by_rule", "unmatched", "count_tokens"}``.
* Anything else: 404 ``not_found_error``. Errors are Anthropic-shaped:
  ``{"type": "error", "error": {"type": ..., "message": ...}}`` with the status code.

Contracts: the reply is a pure function of the request (rules in
:mod:`~durable_harness.testing.fake_model_script`), ids included: the message id is
``msg_`` + sha256(canonical request)[:24], so the same request gets byte-identical bytes.
``requests`` counts ``POST /v1/messages``, ``/v1/responses`` and ``/v1/chat/completions``
calls (the calls a provider
would bill). Every
answered request except ``/_fake/stats`` is logged, and the log line is written and flushed
before the first byte of the response, so a client killed mid-stream is still counted.
Any API key is accepted; the log records whether one was sent.

Beside this module: :mod:`~durable_harness.testing.fake_model_http` (the request handler),
:mod:`~durable_harness.testing.fake_model_answers` (the answers and the table of APIs),
:mod:`~durable_harness.testing.fake_model_script` (the script's rules). This module holds
the server (its counters and log) and the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import signal
import sys
import threading
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any, Self

from durable_harness.adapters.proxy.sse import stream_events
from durable_harness.core.canonical import dumps_compact
from durable_harness.core.closing import Closing
from durable_harness.core.errors import ConfigError
from durable_harness.harness.listener import BodyLimit, Limits, Listener, SyncApp
from durable_harness.testing.fake_model_answers import (
    BILLED_PATHS,
    CHAT,
    MESSAGES,
    RESPONSES,
    Answer,
    Api,
    error_message,
    parse_request,
)
from durable_harness.testing.fake_model_http import handle, refusal
from durable_harness.testing.fake_model_script import (
    RequestView,
    Script,
    build_message,
    canonical_request,
    load_script,
    parse_script,
)

__all__ = [
    "FakeModelServer",
    "Script",
    "build_message",
    "load_script",
    "main",
    "parse_script",
    "run_fake_model",
    "stream_events",
]

_LOGGED_TEXT = 500  # the log keeps the start of the last user text, enough to recognise it


# A JSON escape of a surrogateescape surrogate (not itself an escaped backslash).
_ESCAPED_BYTE = re.compile(rb"(?<!\\)\\udc([89a-f][0-9a-f])")


def _raw_bytes(data: bytes) -> bytes:
    """``data`` with each ``\\udcXX`` escape (XX >= 80) as the byte XX: see ``raw_bytes``."""
    return _ESCAPED_BYTE.sub(lambda m: bytes([int(m.group(1), 16)]), data)


class FakeModelServer(Closing):
    """The fake model on ``127.0.0.1``; ``port=0`` picks a free port (see :attr:`url`).

    The socket is bound on construction, so :attr:`url` is known before :meth:`start`.
    Use as a context manager (``with FakeModelServer(script) as server:``) or call
    :meth:`start` / :meth:`stop`; the CLI calls :meth:`serve_forever`.
    """

    def __init__(
        self,
        script: Script | Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: Path | str | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.script = script if isinstance(script, Script) else load_script(script)
        self._lock = threading.Lock()
        self._requests = 0
        self._logged = 0
        self._unmatched = 0
        self._count_tokens = 0
        self._by_rule: dict[str, int] = {}
        self._stopping = threading.Event()
        limits = limits or Limits.from_settings()
        try:
            self._httpd = Listener(
                BodyLimit(SyncApp(partial(handle, self)), limits, refusal),
                host,
                port,
                limits,
                name="fake-model",
            )
        except OSError as exc:
            raise ConfigError(
                f"fake model cannot listen on {host}:{port}: {exc.strerror}; pick another --port"
            ) from None
        self._log_file: IO[str] | None = None
        if log_path is not None:
            try:
                self._log_file = open(log_path, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                self._httpd.stop()
                raise ConfigError(
                    f"fake model cannot open its log {log_path}: {exc.strerror}"
                ) from None

    @property
    def url(self) -> str:
        return self._httpd.url

    @property
    def port(self) -> int:
        return self._httpd.port

    @property
    def request_count(self) -> int:
        """Model calls (messages, responses, chat completions) answered so far, matched or not."""
        with self._lock:
            return self._requests

    def stats(self) -> dict[str, Any]:
        """What ``GET /_fake/stats`` returns."""
        with self._lock:
            return {
                "requests": self._requests,
                "by_rule": dict(self._by_rule),
                "unmatched": self._unmatched,
                "count_tokens": self._count_tokens,
            }

    def start(self) -> FakeModelServer:
        """Serve in a daemon thread; returns self."""
        self._httpd.start()
        return self

    def serve_forever(self) -> None:
        """Serve until :meth:`request_stop` (safe from a signal handler), then stop."""
        self.start()
        # A bounded wait keeps the main thread responsive to signals on every platform.
        while not self._stopping.wait(0.5):
            pass
        self.stop()

    def stopping_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (a scripted delay); True if the server began stopping."""
        return self._stopping.wait(seconds)

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to return; only sets a flag, so signal-handler safe."""
        self._stopping.set()

    def stop(self) -> None:
        """Stop serving, abort streams in flight, close the socket and the log."""
        self._stopping.set()
        self._httpd.stop()
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def close(self) -> None:
        """:meth:`stop` (``with`` calls it on the way out)."""
        self.stop()

    # --- answering ----------------------------------------------------------------------

    def answer_messages(self, body: bytes) -> Answer:
        """Answer a ``POST /v1/messages`` body (a pure function of the body and script)."""
        return self._answer(body, MESSAGES)

    def answer_responses(self, body: bytes) -> Answer:
        """Answer a ``POST /v1/responses`` body from the same rules (a pure function)."""
        return self._answer(body, RESPONSES)

    def answer_chat(self, body: bytes) -> Answer:
        """Answer a ``POST /v1/chat/completions`` body from the same rules (a pure function)."""
        return self._answer(body, CHAT)

    def _answer(self, body: bytes, api: Api) -> Answer:
        request = parse_request(body, api.required)
        if isinstance(request, Answer):
            request.path = api.path
            # The parse error, in this API's shape.
            request.body = api.error_body("invalid_request_error", error_message(request))
            return request
        stream = request.get("stream") is True
        view = api.view(request)
        digest = api.request_hash(request)
        answer = Answer(
            status=200,
            path=api.path,
            stream=stream,
            request_hash=digest,
            last_user_text=view.last_user_text,
            headers={api.id_header: "req_" + digest[:24]},
        )
        index = self.script.match(view)
        if index is None:
            shown = view.last_user_text[:300]
            answer.status = 400
            answer.body = api.error_body(
                "invalid_request_error",
                f"fake model: no rule matches the request (last user text: {shown!r})",
            )
            return answer
        rule = self.script.rules[index]
        answer.rule = self.script.label(index)
        answer.delay_s = rule.reply.delay_ms / 1000
        if rule.reply.error is not None:
            answer.status = rule.reply.error.http_status
            answer.body = api.error_body(rule.reply.error.type, rule.reply.error.message)
            return answer
        reply = api.build(request, rule, digest)
        if stream:
            answer.events = api.frames(reply, request)
            answer.chunk_delay_s = rule.reply.chunk_delay_ms / 1000
        else:
            answer.body = dumps_compact(reply)
        if rule.reply.raw_bytes:
            answer.body = _raw_bytes(answer.body)
            answer.events = None if answer.events is None else list(map(_raw_bytes, answer.events))
        answer.stream_fault = rule.reply.stream_fault
        answer.fault_after = rule.reply.fault_after
        return answer

    def answer_count_tokens(self, body: bytes) -> Answer:
        request = parse_request(body)
        if isinstance(request, Answer):
            request.path = "/v1/messages/count_tokens"
            return request
        canonical = canonical_request(request)
        return Answer(
            status=200,
            path="/v1/messages/count_tokens",
            body=dumps_compact({"input_tokens": max(1, len(canonical) // 4)}),
            request_hash=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
            last_user_text=RequestView.of(request).last_user_text,
        )

    def record(self, answer: Answer, api_key_sent: bool) -> None:
        """Count and log ``answer`` (before it is sent: see the module contract)."""
        with self._lock:
            if answer.path in BILLED_PATHS:
                self._requests += 1
                if answer.rule is not None:
                    self._by_rule[answer.rule] = self._by_rule.get(answer.rule, 0) + 1
                elif answer.request_hash is not None:
                    self._unmatched += 1
            elif answer.path == "/v1/messages/count_tokens":
                self._count_tokens += 1
            self._logged += 1
            if self._log_file is None:
                return
            line = {
                "n": self._logged,
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "path": answer.path,
                "stream": answer.stream,
                "rule": answer.rule,
                "request_hash": answer.request_hash,
                "last_user_text": answer.last_user_text[:_LOGGED_TEXT],
                "status": answer.status,
                "api_key_sent": api_key_sent,
                "request_key": answer.request_key,
            }
            self._log_file.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._log_file.flush()


# --- Command line -------------------------------------------------------------------------


def run_fake_model(
    script_path: Path | str,
    port: int = 0,
    log_path: Path | str | None = None,
    host: str = "127.0.0.1",
) -> int:
    """Serve ``script_path`` until SIGTERM or SIGINT; returns the exit status (0).

    Prints ``fake model listening on URL (script: FILE, R rules)`` once, flushed, so a
    parent process can wait for that line before sending requests. A bad script raises
    :class:`ConfigError` before anything is printed.
    """
    script = load_script(script_path)
    server = FakeModelServer(script, host=host, port=port, log_path=log_path)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        server.request_stop()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[signal.Signals, Any] = {}
    if in_main_thread:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        print(
            f"fake model listening on {server.url}"
            f" (script: {script_path}, {len(script.rules)} rules)",
            flush=True,
        )
        server.serve_forever()
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m durable_harness.testing.fake_model --script FILE [--port N] [--log F]``."""
    parser = argparse.ArgumentParser(
        prog="durable-harness fake-model",
        description="Serve a scripted fake model: Anthropic Messages and OpenAI Responses APIs.",
    )
    parser.add_argument("--script", required=True, type=Path, help="TOML script of rules")
    parser.add_argument("--port", type=int, default=0, help="port (0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--log", type=Path, default=None, help="append a JSON line per request")
    args = parser.parse_args(argv)
    try:
        return run_fake_model(args.script, port=args.port, log_path=args.log, host=args.host)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
