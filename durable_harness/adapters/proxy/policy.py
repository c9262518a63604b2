"""What the journaling proxy forwards: only what the CLI's model call is.

The proxy holds the harness's provider key, and its per-launch token is readable to every
process in the sandbox. So a request is not trusted for being authenticated: before it is
journaled or forwarded, :func:`check` holds it against the operator's policy
(:class:`ProxyPolicy`, from ``DURABLE_HARNESS_PROXY_*``), the launch's limits
(:class:`TurnLimits`) and its API's allow-lists (:class:`~.wire.base.WireTable`, next to
each wire format). Refused, with a reason, is:

* a path or query parameter the API's clients do not use (and any method but the ones
  routed); a path of another API than the one the launch's CLI speaks;
* a model that is not the turn's (nor one the CLI itself sends, nor an operator's extra);
* a top-level request field not in the API's table; a beta header value not in it;
  a header that selects another account scope (OpenAI organization or project);
* a provider-side tool (a tool type the client does not run itself; Chat's
  ``web_search_options``, Anthropic's ``mcp_servers``) unless the operator enabled its
  family;
* a content part the provider would fetch from a URL or read from the account's files
  (the provider's network is not the sandbox's);
* an answer length (``max_tokens`` and its per-API spellings) over the ceiling, or a
  ``thinking`` budget over it;
* a model call past the turn's budget (every upstream forward counts, retries of an
  interrupted call included, across workers).

The function is pure: ``(wire, method, path, query, headers, body, policy, limits)`` ->
``None`` (allowed) or a :class:`Refusal`. One exception to refusing: a provider-side tool
that a CLI declares in every request whatever it is configured (Codex's ``web_search``)
is taken out of what is forwarded (:func:`forwarded`) rather than refused, so the model
upstream never has it and the CLI still works. The HTTP layer answers a refusal with the API's
own error shape and neither journals nor forwards the request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from durable_harness.adapters.proxy.wire.base import WireFormat
from durable_harness.core.settings import Settings

__all__ = ["ProxyPolicy", "Refusal", "TurnLimits", "check", "forwarded", "policy_of"]


@dataclass(frozen=True)
class ProxyPolicy:
    """The operator's side of the policy (``DURABLE_HARNESS_PROXY_*``)."""

    #: Models any launch may call besides the turn's (a CLI's small model, say).
    extra_models: frozenset[str] = frozenset()
    #: Provider-side tool families allowed (``web_search`` allows ``web_search_20250305``
    #: and Responses' ``web_search_preview``); ``*`` allows every one.
    server_tools: frozenset[str] = frozenset()
    #: Beta header values allowed besides the API's table.
    extra_betas: frozenset[str] = frozenset()
    #: The ceiling on an answer's length in tokens.
    max_tokens: int = 128_000
    #: Unjournaled calls (count_tokens, models) per launch.
    max_plain_calls: int = 200


@dataclass(frozen=True)
class TurnLimits:
    """The launch's side: its models, its budget, and what was spent of it."""

    models: frozenset[str]
    #: The journaled paths of the APIs the launch's CLI speaks (its wire formats).
    wires: frozenset[str] = frozenset()
    #: The turn's budget of upstream model calls (None: no budget).
    max_model_calls: int | None = None
    #: Upstream model calls made so far in the turn (every attempt of every model step).
    model_calls: int = 0
    #: Unjournaled calls made so far by this launch.
    plain_calls: int = 0


@dataclass(frozen=True)
class Refusal:
    """Why a request is not forwarded: an HTTP status, the API's error kind, a reason."""

    status: int
    kind: str
    reason: str
    #: The turn's budget is spent: the turn ends (as when the journal refuses the step).
    budget: bool = False

    @property
    def message(self) -> str:
        return f"durable-harness proxy policy: {self.reason}"


def _refused(reason: str, status: int = 403, kind: str = "permission_error") -> Refusal:
    return Refusal(status, kind, reason)


def check(
    wire: WireFormat,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: Any,
    policy: ProxyPolicy,
    limits: TurnLimits,
) -> Refusal | None:
    """``None`` when the request is a model call (or plain call) the CLI could make;
    otherwise why not. ``body`` is the parsed JSON body (None for a GET)."""
    journaled = method == "POST" and path == wire.path
    plain = (method == "POST" and path in wire.plain_paths) or (
        method == "GET" and _models_path(path, limits.models | policy.extra_models)
    )
    if not (journaled or plain):
        reason = f"{method} {path} is not a call the agent CLIs make"
        return _refused(reason, 404, "not_found_error")
    if wire.path not in limits.wires:
        reason = f"this launch's CLI does not speak {wire.name} ({path})"
        return _refused(reason, 404, "not_found_error")
    for name, _ in parse_qsl(query, keep_blank_values=True):
        if name not in wire.table.query:
            return _refused(f"query parameter {name!r} is not allowed on {path}")
    refusal = _check_headers(wire, headers, policy)
    if refusal is None and body is not None:
        refusal = _check_body(wire, body, policy, limits)
    if refusal is not None:
        return refusal
    if plain:
        if limits.plain_calls >= policy.max_plain_calls:
            return _refused(
                f"this launch made {limits.plain_calls} {path} calls; the limit is "
                f"{policy.max_plain_calls} (DURABLE_HARNESS_PROXY_MAX_PLAIN_CALLS)",
                429,
                "rate_limit_error",
            )
        return None
    budget = limits.max_model_calls
    if budget is not None and limits.model_calls >= budget:
        return Refusal(
            429,
            "rate_limit_error",
            # The journal's own wording (harness/journal.py), whichever refuses first.
            f"the agent made {limits.model_calls} model calls in this turn without "
            f"finishing; the turn's limit is {budget} (raise it with --max-model-calls)",
            budget=True,
        )
    return None


def _models_path(path: str, models: frozenset[str]) -> bool:
    """``GET /v1/models`` (the list) or ``/v1/models/<an allowed model>``."""
    if path == "/v1/models":
        return True
    return path.startswith("/v1/models/") and path.removeprefix("/v1/models/") in models


def _check_headers(
    wire: WireFormat, headers: Mapping[str, str], policy: ProxyPolicy
) -> Refusal | None:
    table = wire.table
    for name, value in headers.items():
        lower = name.lower()
        if lower in table.refused_headers:
            return _refused(f"the {name} header selects another account scope")
        if lower == table.beta_header:
            for beta in (b.strip() for b in value.split(",")):
                if beta and beta not in table.betas and beta not in policy.extra_betas:
                    return _refused(
                        f"beta {beta!r} is not allowed (DURABLE_HARNESS_PROXY_EXTRA_BETAS)"
                    )
        elif lower == "openai-beta" and table.beta_header is None:
            # Not a header the allow-listed CLIs send on the OpenAI wires.
            return _refused(f"the {name} header is not allowed")
    return None


def _check_body(
    wire: WireFormat, body: Any, policy: ProxyPolicy, limits: TurnLimits
) -> Refusal | None:
    if not isinstance(body, dict):
        return _refused("the request body is not a JSON object", 400, "invalid_request_error")
    table = wire.table
    model = body.get("model")
    allowed = limits.models | policy.extra_models
    if model not in allowed:
        return _refused(
            f"model {model!r} is not this turn's ({', '.join(sorted(allowed))}; "
            "DURABLE_HARNESS_PROXY_EXTRA_MODELS adds others)"
        )
    for name in body:
        family = table.server_fields.get(name)
        if family is not None:
            if not _enabled(family, policy):
                return _refused(
                    f"{name!r} is a provider-side tool (DURABLE_HARNESS_PROXY_SERVER_TOOLS)"
                )
        elif name not in table.fields:
            return _refused(f"request field {name!r} is not allowed")
    for name in table.token_fields:
        refusal = _check_tokens(name, body.get(name), policy)
        if refusal is not None:
            return refusal
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        refusal = _check_tokens("thinking.budget_tokens", thinking.get("budget_tokens"), policy)
        if refusal is not None:
            return refusal
    for name in table.off_fields:
        if body.get(name) not in (None, False):
            return _refused(f"{name!r} may only be false")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return _refused("'tools' is not a list", 400, "invalid_request_error")
    for tool in _tools(tools or [], table.group_tool):
        kind = tool.get("type") if isinstance(tool, dict) else "?"
        if kind in table.client_executed and tool.get("execution") == "client":
            continue
        if (
            kind not in table.client_tools
            and kind not in table.stripped_tools
            and not _enabled(str(kind), policy)
        ):
            return _refused(
                f"tool type {kind!r} runs at the provider (DURABLE_HARNESS_PROXY_SERVER_TOOLS)"
            )
    for where, url in _fetched(body):
        return _refused(f"{where} would make the provider fetch {url[:80]!r}")
    return None


def _tools(tools: list[Any], group: str | None) -> Iterator[Any]:
    """Every tool of a request, the members of a group (Codex's ``namespace``) included."""
    for tool in tools:
        if group is not None and isinstance(tool, dict) and tool.get("type") == group:
            members = tool.get("tools")
            yield from _tools(members if isinstance(members, list) else ["?"], group)
        else:
            yield tool


def forwarded(wire: WireFormat, body: dict[str, Any], policy: ProxyPolicy) -> dict[str, Any] | None:
    """The body to forward when it is not the one received: the request less the
    provider-side tools its CLI always declares (:attr:`~.wire.base.WireTable.stripped_tools`)
    that the operator did not enable; None when it goes as it came."""
    stripped = wire.table.stripped_tools
    tools = body.get("tools")
    if not stripped or not isinstance(tools, list):
        return None
    kept = [
        t
        for t in tools
        if not (isinstance(t, dict) and t.get("type") in stripped)
        or _enabled(str(t.get("type")), policy)
    ]
    return None if len(kept) == len(tools) else {**body, "tools": kept}


def _check_tokens(name: str, value: Any, policy: ProxyPolicy) -> Refusal | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return _refused(f"{name} must be a positive whole number", 400, "invalid_request_error")
    if value > policy.max_tokens:
        return _refused(
            f"{name} {value} is over the ceiling of {policy.max_tokens} "
            "(DURABLE_HARNESS_PROXY_MAX_TOKENS)"
        )
    return None


def _enabled(kind: str, policy: ProxyPolicy) -> bool:
    """Whether the operator enabled the server tool ``kind`` (its family is a prefix)."""
    return "*" in policy.server_tools or any(kind.startswith(f) for f in policy.server_tools)


_URL_PREFIXES = ("http://", "https://", "ftp://")


def _fetched(value: Any, where: str = "body") -> Iterator[tuple[str, str]]:
    """Content parts the provider would read from elsewhere than the request: a URL
    (Anthropic's ``source.type: url``, OpenAI's ``image_url``/``file_url`` with a web URL)
    or a file stored on the account (``file_id``, Anthropic's ``source.type: file``)."""
    if isinstance(value, list):
        for item in value:
            yield from _fetched(item, where)
        return
    if not isinstance(value, dict):
        return
    source = value.get("source")
    if isinstance(source, dict) and source.get("type") in ("url", "file"):
        yield f"a {value.get('type')} block", str(source.get("url") or source.get("file_id"))
    for name in ("image_url", "file_url"):
        url = value.get(name)
        if isinstance(url, dict):
            url = url.get("url")
        if isinstance(url, str) and url.lower().startswith(_URL_PREFIXES):
            yield f"a {value.get('type')} part", url
    if isinstance(value.get("file_id"), str):
        yield f"a {value.get('type')} part", "file " + str(value["file_id"])
    for key in ("messages", "input", "content", "system", "output", "file"):
        if key in value:
            yield from _fetched(value[key], where)


def policy_of(settings: Settings) -> ProxyPolicy:
    """The operator's policy from the harness's settings (``DURABLE_HARNESS_PROXY_*``)."""
    return ProxyPolicy(
        extra_models=frozenset(settings.proxy_extra_models),
        server_tools=frozenset(settings.proxy_server_tools),
        extra_betas=frozenset(settings.proxy_extra_betas),
        max_tokens=settings.proxy_max_tokens,
        max_plain_calls=settings.proxy_max_plain_calls,
    )
