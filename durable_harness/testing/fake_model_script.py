"""The fake model's script and replies: TOML rules, how a request matches one, what it answers.

Everything here is pure (no I/O but reading the script): :mod:`.fake_model` puts it on HTTP.

A script is a list of ``[[rule]]`` tables. Rules are tried in order; the first rule whose
every ``when`` condition holds for the request answers it. A rule without ``when`` matches
everything. The answer depends only on the request (never on a call counter), so a run is
deterministic and a re-sent request gets the same reply: exactly what a journal replay or
a crashed-and-resumed turn needs from a model.

::

    [[rule]]
    name = "check first"                  # optional; unique; used in logs and stats
    when.last_user_text = "Refund order"  # conditions, all must hold (see When)
    reply.text = "Let me check."
    reply.tool_use = [{ name = "check_refund", input = { order = 42 } }]

A bad script raises :class:`ConfigError` naming the rule and the problem.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from durable_harness.core.canonical import canonical_json as core_canonical_json
from durable_harness.core.canonical import dumps_compact
from durable_harness.core.errors import ConfigError

# The status Anthropic sends with each error type, so a script may name only the type.
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class _Strict(BaseModel):
    # extra="forbid" is what turns a typo such as `when.last_user_txt` into an error
    # instead of a condition that silently matches everything.
    model_config = ConfigDict(extra="forbid", frozen=True)


class When(_Strict):
    """Conditions on the request; every condition given must hold."""

    last_user_text: str | None = None
    """Substring of the text of the last user message (string content counts as text)."""
    last_tool_name: str | None = None
    """The last user message answers a tool_use of this name (via its tool_use_id)."""
    last_tool_result: str | None = None
    """Substring of the text of the tool_result blocks of the last user message."""
    conversation: str | None = None
    """Substring of ``json.dumps(messages, ensure_ascii=False)`` (default separators)."""
    not_conversation: str | None = None
    """Substring that must be absent from that same JSON."""
    system: str | None = None
    """Substring of the system prompt (a string or its text blocks joined by newlines)."""
    has_tool: str | None = None
    """The request offers a tool of exactly this name."""
    model: str | None = None
    """The request's model, exactly."""

    def matches(self, view: RequestView) -> bool:
        """Whether every condition given holds for the request seen through ``view``."""
        checks = (
            self.last_user_text is None or self.last_user_text in view.last_user_text,
            self.last_tool_name is None or self.last_tool_name in view.last_tool_names,
            self.last_tool_result is None or self.last_tool_result in view.last_tool_result,
            self.conversation is None or self.conversation in view.conversation,
            self.not_conversation is None or self.not_conversation not in view.conversation,
            self.system is None or self.system in view.system,
            self.has_tool is None or self.has_tool in view.tool_names,
            self.model is None or self.model == view.model,
        )
        return all(checks)


class ToolUse(_Strict):
    """One tool_use block of a reply; its id is derived from the request (deterministic)."""

    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    #: Responses API only: the ``namespace`` of the ``function_call`` (Codex serves MCP
    #: tools as namespace tools, e.g. ``mcp__durable_harness`` with ``notify``).
    namespace: str | None = None

    @model_validator(mode="after")
    def _input_is_json(self) -> ToolUse:
        # TOML has dates and times, JSON does not: refuse them here, not mid-request.
        try:
            json.dumps(self.input)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"input must hold only JSON values (no TOML dates): {exc}") from exc
        return self


class Usage(_Strict):
    """The usage a reply reports (``reply.usage``), for tests of cost accounting. Counts
    not given: input and output derived from the request's and reply's lengths, cache
    reads and writes 0. Each API gets its own spelling: Anthropic's ``input_tokens``
    leaves the cached parts out; OpenAI's count them in (``cached_tokens`` beside) and
    know no cache writes, so ``cache_write_tokens`` is plain input there."""

    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)


class ErrorReply(_Strict):
    """Answer with an API error instead of a message, shaped as Anthropic's."""

    type: str = Field(min_length=1)
    status: int | None = Field(default=None, ge=400, le=599)
    message: str = "Error from the fake model"

    @model_validator(mode="after")
    def _status_known(self) -> ErrorReply:
        if self.status is None and self.type not in ERROR_STATUS:
            raise ValueError(
                f"give a status for the unknown error type {self.type!r} "
                f"(known types: {', '.join(ERROR_STATUS)})"
            )
        return self

    @property
    def http_status(self) -> int:
        return self.status if self.status is not None else ERROR_STATUS[self.type]


class Reply(_Strict):
    """What a matching rule answers: text and/or tool_use blocks, or an error."""

    text: str | None = Field(default=None, min_length=1)
    text_json: str | None = Field(default=None, min_length=1)
    """The text as the inside of a JSON string literal, read as JSON reads it (instead of
    ``text``): how a script gives what TOML cannot hold, a lone surrogate (``'\ud83d'``)."""
    raw_bytes: bool = False
    """Send each U+DC80..U+DCFF of the text as the single byte it stands for
    (``surrogateescape``), unescaped: a reply whose bytes are not valid UTF-8."""
    tool_use: list[ToolUse] = Field(default_factory=list)
    error: ErrorReply | None = None
    usage: Usage = Field(default_factory=Usage)
    delay_ms: int = Field(default=0, ge=0)
    chunk_delay_ms: int = Field(default=0, ge=0)
    stream_fault: Literal["drop", "malformed"] | None = None
    """Break the reply. Streamed: after ``fault_after`` events, ``drop`` the connection (no
    end of stream) or send a ``malformed`` event (data that is not JSON) and end. JSON:
    send half the body, then hang up (``drop``) or end there (``malformed``)."""
    fault_after: int = Field(default=2, ge=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Reply:
        if self.text is not None and self.text_json is not None:
            raise ValueError("give text or text_json, not both")
        if self.text_json is not None:
            try:
                json.loads(f'"{self.text_json}"')
            except ValueError as exc:
                raise ValueError(f"text_json is not the inside of a JSON string: {exc}") from exc
        has_content = self.content_text is not None or bool(self.tool_use)
        if self.error is not None and has_content:
            raise ValueError("give either error or text/tool_use, not both")
        if self.error is None and not has_content:
            raise ValueError("give text, tool_use or error")
        return self

    @property
    def content_text(self) -> str | None:
        """The reply's text, from ``text`` or ``text_json``."""
        if self.text_json is not None:
            text: str = json.loads(f'"{self.text_json}"')
            return text
        return self.text

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.tool_use else "end_turn"


class Rule(_Strict):
    """``when`` the request looks like this, ``reply`` with that."""

    name: str | None = Field(default=None, min_length=1)
    when: When = Field(default_factory=When)
    reply: Reply


class Script(_Strict):
    """An ordered list of rules; the first rule that matches a request answers it."""

    rules: list[Rule] = Field(min_length=1)
    source: str = "<script>"

    @model_validator(mode="after")
    def _unique_names(self) -> Script:
        # Names key the stats and the log: two rules with one name would blur them.
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name is not None:
                if rule.name in seen:
                    raise ValueError(f"two rules are named {rule.name!r}")
                seen.add(rule.name)
        return self

    def label(self, index: int) -> str:
        """How logs and stats name rule ``index`` (0-based): its name, else ``#<n>`` 1-based."""
        return self.rules[index].name or f"#{index + 1}"

    def match(self, view: RequestView) -> int | None:
        """Index of the first rule matching the request, or None."""
        for index, rule in enumerate(self.rules):
            if rule.when.matches(view):
                return index
        return None


class _ScriptFile(_Strict):
    rule: list[Rule] = Field(min_length=1)


_SECTIONS: dict[str, type[BaseModel]] = {
    "when": When,
    "reply": Reply,
    "error": ErrorReply,
    "tool_use": ToolUse,
    "usage": Usage,
}


def parse_script(text: str, source: str = "<script>") -> Script:
    """Build a :class:`Script` from TOML text; any problem raises :class:`ConfigError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"fake model script {source}: not valid TOML: {exc}") from None
    try:
        parsed = _ScriptFile.model_validate(data)
        return Script(rules=parsed.rule, source=source)
    except ValidationError as exc:
        problems = "; ".join(_describe(error, data) for error in exc.errors())
        raise ConfigError(f"fake model script {source}: {problems}") from None


def load_script(path: Path | str) -> Script:
    """Read and validate a script file; any problem raises :class:`ConfigError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read fake model script {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"fake model script {path} is not UTF-8: {exc}") from None
    return parse_script(text, source=str(path))


def _describe(error: Any, data: dict[str, Any]) -> str:
    """One pydantic error as ``rule #2 ('name'): when.foo: unknown key (allowed: ...)``."""
    loc = [part for part in error["loc"] if not str(part).startswith("function-")]
    if error["type"] == "missing" and loc == ["rule"]:
        return "the script has no [[rule]] tables"
    where = ""
    if loc[:1] == ["rule"] and len(loc) > 1 and isinstance(loc[1], int):
        index = loc[1]
        where = f"rule #{index + 1}"
        rules = data.get("rule")
        if isinstance(rules, list) and isinstance(rules[index], dict):
            name = rules[index].get("name")
            if isinstance(name, str):
                where += f" ({name!r})"
        loc = loc[2:]
    elif loc[:1] == ["rule"]:
        loc = loc[1:]
        where = "[[rule]]"
    elif not loc:
        where = "script"
    field_path = ".".join(str(part) for part in loc)
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        parents = [str(part) for part in loc[:-1] if not isinstance(part, int)]
        model = _SECTIONS.get(parents[-1]) if parents else (Rule if where else _ScriptFile)
        if model is not None:
            message = f"unknown key (allowed: {', '.join(model.model_fields)})"
        else:
            message = "unknown key"
    parts = [part for part in (where, field_path) if part]
    return f"{': '.join(parts)}: {message}" if parts else message


# --- Seeing a request the way rules look at it -------------------------------------------


@dataclass(frozen=True)
class RequestView:
    """The parts of a Messages API request that ``when`` conditions look at."""

    last_user_text: str
    last_tool_names: frozenset[str]
    last_tool_result: str
    conversation: str
    system: str
    tool_names: frozenset[str]
    model: str

    @classmethod
    def of(cls, request: dict[str, Any]) -> RequestView:
        """Read a request defensively: odd shapes make conditions fail, never crash."""
        messages = request.get("messages")
        messages = messages if isinstance(messages, list) else []
        last_user_index = _last_user_index(messages)
        last_user: Any = messages[last_user_index] if last_user_index is not None else {}
        content = last_user.get("content") if isinstance(last_user, dict) else None
        blocks = _blocks(content)
        names_by_id = _tool_names_by_id(messages[: last_user_index or 0])
        result_ids = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        tools = request.get("tools")
        model = request.get("model")
        return cls(
            last_user_text=_text_of(content),
            last_tool_names=frozenset(
                names_by_id[i] for i in result_ids if isinstance(i, str) and i in names_by_id
            ),
            last_tool_result="\n".join(
                _text_of(b.get("content")) for b in blocks if b.get("type") == "tool_result"
            ),
            conversation=json.dumps(messages, ensure_ascii=False),
            system=_text_of(request.get("system")),
            tool_names=frozenset(
                t["name"]
                for t in (tools if isinstance(tools, list) else [])
                if isinstance(t, dict) and isinstance(t.get("name"), str)
            ),
            model=model if isinstance(model, str) else "",
        )


def _last_user_index(messages: list[Any]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return index
    return None


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def _text_of(content: Any) -> str:
    """A string as is, else the text blocks of a block list joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(
        block["text"]
        for block in _blocks(content)
        if block.get("type") == "text" and isinstance(block.get("text"), str)
    )


def _tool_names_by_id(messages: list[Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for block in _blocks(message.get("content")):
            if block.get("type") == "tool_use":
                tool_id, name = block.get("id"), block.get("name")
                if isinstance(tool_id, str) and isinstance(name, str):
                    names[tool_id] = name
    return names


# --- Determinism --------------------------------------------------------------------------

# Fields that differ between two sends of the same logical request: `stream` (the same
# question asked streaming or not gets the same answer) and `metadata` (per-session ids).
_VOLATILE_FIELDS = ("stream", "metadata")


def canonical_request(request: dict[str, Any]) -> str:
    """The request as canonical JSON (sorted keys, compact), without volatile fields."""
    stable = {k: v for k, v in request.items() if k not in _VOLATILE_FIELDS}
    return canonical_json(stable)


def canonical_json(value: Any) -> str:
    # The journal's spelling (lone surrogates escaped, so a request holding one hashes).
    return core_canonical_json(value)


def stable_digest(request: dict[str, Any], volatile: tuple[str, ...]) -> str:
    """sha256 hex of ``request`` without its ``volatile`` fields: what changes between two
    sends of one question (the OpenAI APIs' request hash)."""
    stable = {k: v for k, v in request.items() if k not in volatile}
    return hashlib.sha256(canonical_json(stable).encode("utf-8")).hexdigest()


def request_hash(request: dict[str, Any]) -> str:
    """sha256 hex of :func:`canonical_request`: the seed of every id in the reply."""
    return hashlib.sha256(canonical_request(request).encode("utf-8")).hexdigest()


# --- Replies ---------------------------------------------------------------------------


def error_body(error_type: str, message: str) -> bytes:
    return dumps_compact({"type": "error", "error": {"type": error_type, "message": message}})


def build_message(request: dict[str, Any], rule: Rule) -> dict[str, Any]:
    """The Messages API response ``rule`` gives to ``request``: deterministic, ids included."""
    canonical = canonical_request(request)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    content: list[dict[str, Any]] = []
    text = rule.reply.content_text
    if text is not None:
        content.append({"type": "text", "text": text})
    for index, tool in enumerate(rule.reply.tool_use):
        tool_id = "toolu_" + hashlib.sha256(f"{digest}{index}".encode()).hexdigest()[:24]
        content.append({"type": "tool_use", "id": tool_id, "name": tool.name, "input": tool.input})
    model = request.get("model")
    return {
        "id": "msg_" + digest[:24],
        "type": "message",
        "role": "assistant",
        "model": model if isinstance(model, str) else "fake-model",
        "content": content,
        "stop_reason": rule.reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": _or(rule.reply.usage.input_tokens, canonical),
            "cache_creation_input_tokens": rule.reply.usage.cache_write_tokens,
            "cache_read_input_tokens": rule.reply.usage.cache_read_tokens,
            "output_tokens": _or(rule.reply.usage.output_tokens, canonical_json(content)),
        },
    }


def _or(count: int | None, text: str) -> int:
    """A scripted token count, else one token per four characters of ``text``."""
    return max(1, len(text) // 4) if count is None else count


def openai_counts(usage: Usage, request_text: str, reply_text: str) -> tuple[int, int, int]:
    """(input with the cached part in it, cached, output): how both OpenAI APIs count."""
    cached = usage.cache_read_tokens
    plain = _or(usage.input_tokens, request_text) + usage.cache_write_tokens
    return plain + cached, cached, _or(usage.output_tokens, reply_text)
