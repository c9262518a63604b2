"""The proxy's request policy (``adapters/proxy/policy.py``), per wire format, through the
real proxy in front of the fake model: a request a CLI's model call is not (another
model, a field or beta or header the CLIs do not send, a provider-side tool, content the
provider would fetch, a ``max_tokens`` over the ceiling, an unknown path, a call past the
turn's budget) gets an error in its API's shape with the reason, is not journaled, and
the fake model's log shows it never arrived. What the operator enables passes; a
recorded call replays whatever the policy became.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from proxy_cases import TOKEN, WIRES, Rig, WireCase, open_rig

from durable_harness.adapters.proxy.policy import ProxyPolicy
from durable_harness.core.errors import TurnFailed


@pytest.fixture(params=list(WIRES))
def case(request: pytest.FixtureRequest) -> WireCase:
    return WIRES[request.param]


@pytest.fixture
def rig(tmp_path: Path, case: WireCase) -> Iterator[Rig]:
    with open_rig(tmp_path, case) as rig:
        yield rig


def send(
    rig: Rig,
    body: Any = None,
    *,
    method: str = "POST",
    path: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    parts = urlsplit(rig.proxy.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(
            method, path or rig.case.path, data, {**rig.case.auth(TOKEN), **(headers or {})}
        )
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def upstream_log(rig: Rig) -> list[dict[str, Any]]:
    return rig.fake_log() if rig.log.exists() else []


# What each wire's CLI does not send, as (name, extra request fields or None, headers,
# path, the reason's words). ``None`` fields: the request itself is replaced (below).
TOOL = {
    "anthropic": {"name": "Bash", "input_schema": {"type": "object"}},
    "chat": {"type": "function", "function": {"name": "bash", "parameters": {}}},
    "responses": {"type": "function", "name": "exec_command", "parameters": {}},
}
SERVER_TOOLS = {
    "anthropic": [
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "web_fetch_20250910", "name": "web_fetch"},
        {"type": "code_execution_20250825", "name": "code_execution"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 800},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ],
    "chat": [{"type": "web_search"}, {"type": "file_search"}],
    "responses": [
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "computer_use_preview", "display_width": 800},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "https://example.invalid"},
        {"type": "local_shell"},
        {"type": "namespace", "name": "n", "tools": [{"type": "web_search_preview"}]},
        {"type": "tool_search"},  # run by the provider: only "execution": "client" passes
        {"type": "tool_search", "execution": "server"},
    ],
}
UNKNOWN_FIELDS = {
    "anthropic": [{"service_tier": "auto"}, {"mcp_servers": []}, {"container": "c"}],
    "chat": [{"n": 2}, {"web_search_options": {}}, {"audio": {}}, {"store": True}],
    "responses": [
        {"previous_response_id": "resp_other"},
        {"background": True},
        {"conversation": "conv_1"},
        {"prompt": {"id": "pmpt_1"}},
        {"store": True},
    ],
}
FETCHED = {
    "anthropic": {
        "type": "image",
        "source": {"type": "url", "url": "https://example.invalid/x.png?leak=1"},
    },
    "chat": {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}},
    "responses": {"type": "input_image", "image_url": "https://example.invalid/x.png"},
}
TOKEN_FIELDS = {
    "anthropic": ["max_tokens"],
    "chat": ["max_tokens", "max_completion_tokens"],
    "responses": ["max_output_tokens"],
}


def _with_content(case: WireCase, part: dict[str, Any]) -> dict[str, Any]:
    body = case.request("look at this")
    if case.name == "responses":
        body["input"][0]["content"].append(part)
    else:
        message = body["messages"][-1]
        message["content"] = [{"type": "text", "text": "look at this"}, part]
    return body


def refused_requests(
    case: WireCase,
) -> list[tuple[str, dict[str, Any] | None, dict[str, str], str]]:
    """(what, body, headers, path) of each request the policy must refuse."""
    name, ask = case.name, case.request
    out: list[tuple[str, dict[str, Any] | None, dict[str, str], str]] = [
        ("another model", {**ask("hi"), "model": "claude-opus-4-1"}, {}, case.path),
        ("no model", {k: v for k, v in ask("hi").items() if k != "model"}, {}, case.path),
        ("unknown query", ask("hi"), {}, case.wire.path + "?evil=1"),
        ("unknown path", ask("hi"), {}, "/v1/files"),
        ("batches", ask("hi"), {}, "/v1/messages/batches"),
        ("fetched content", _with_content(case, FETCHED[name]), {}, case.path),
    ]
    for field in TOKEN_FIELDS[name]:
        out.append((f"huge {field}", {**ask("hi"), field: 10_000_000}, {}, case.path))
    if name == "anthropic":
        out.append(
            (
                "huge thinking",
                {**ask("hi"), "thinking": {"type": "enabled", "budget_tokens": 10**7}},
                {},
                case.path,
            )
        )
        out.append(
            ("foreign beta", ask("hi"), {"anthropic-beta": "web-fetch-2025-09-10"}, case.path)
        )
        out.append(
            (
                "one bad beta",
                ask("hi"),
                {"anthropic-beta": "claude-code-20250219,mcp-client-2025-04-04"},
                case.path,
            )
        )
    else:
        out.append(("organization", ask("hi"), {"OpenAI-Organization": "org-other"}, case.path))
        out.append(("project", ask("hi"), {"OpenAI-Project": "proj_other"}, case.path))
        out.append(("openai beta", ask("hi"), {"OpenAI-Beta": "assistants=v2"}, case.path))
    for tool in SERVER_TOOLS[name]:
        body = {**ask("hi"), "tools": [TOOL[name], tool]}
        out.append((f"server tool {tool['type']}", body, {}, case.path))
    for extra in UNKNOWN_FIELDS[name]:
        out.append((f"field {next(iter(extra))}", {**ask("hi"), **extra}, {}, case.path))
    return out


def test_what_a_cli_does_not_send_is_refused_unjournaled_and_never_upstream(rig: Rig) -> None:
    refused = refused_requests(rig.case)
    for what, body, headers, path in refused:
        status, reply = send(rig, body, path=path, headers=headers)
        assert status in (400, 403, 404), (what, status, reply)
        assert "durable-harness proxy" in json.dumps(reply), (what, reply)
        if urlsplit(path).path == rig.case.wire.path:  # an unknown path has no API shape
            assert isinstance(reply, dict) and rig.case.error_shaped(reply), (what, reply)
    assert upstream_log(rig) == []
    assert rig.steps() == [] and rig.proxy.fatal is None
    by_policy = [r for r in refused if urlsplit(r[3]).path == rig.case.wire.path]
    assert len(rig.proxy.refused) == min(len(by_policy), 20)
    # The same rig forwards and journals what a CLI does send: the refusals were not vacuous.
    status, _ = send(rig, {**rig.case.request("hi"), "tools": [TOOL[rig.case.name]]})
    assert status == 200
    assert len(upstream_log(rig)) == 1 and len(rig.steps()) == 1
    print(f"{rig.case.name}: {len(refused)} requests refused, 0 upstream")


def test_reasons_name_the_setting_to_change(rig: Rig) -> None:
    case = rig.case
    field = TOKEN_FIELDS[case.name][0]
    _, reply = send(rig, {**case.request("hi"), field: 999_999})
    assert "over the ceiling of 128000" in json.dumps(reply)
    assert "DURABLE_HARNESS_PROXY_MAX_TOKENS" in json.dumps(reply)
    _, reply = send(rig, {**case.request("hi"), "model": "gpt-other"})
    assert "'gpt-other' is not this turn's" in json.dumps(reply)
    tool = SERVER_TOOLS[case.name][0]
    _, reply = send(rig, {**case.request("hi"), "tools": [tool]})
    assert "DURABLE_HARNESS_PROXY_SERVER_TOOLS" in json.dumps(reply)
    assert upstream_log(rig) == []


def test_what_the_operator_enables_passes(rig: Rig) -> None:
    case = rig.case
    tool = SERVER_TOOLS[case.name][0]
    field = TOKEN_FIELDS[case.name][0]
    body = {**case.request("hi"), "model": "extra-model", "tools": [tool], field: 200_000}
    assert send(rig, body)[0] == 403
    rig.proxy.policy = ProxyPolicy(
        extra_models=frozenset({"extra-model"}),
        server_tools=frozenset({str(tool["type"]).split("_")[0]}),
        max_tokens=300_000,
    )
    status, reply = send(rig, body)
    assert status == 200, reply
    assert len(upstream_log(rig)) == 1 and len(rig.steps()) == 1


def test_a_recorded_call_replays_after_the_policy_was_tightened(rig: Rig) -> None:
    case = rig.case
    field = TOKEN_FIELDS[case.name][0]
    body = {**case.request("hi", stream=False), field: 100}
    first = send(rig, body)
    assert first[0] == 200 and len(upstream_log(rig)) == 1
    # The operator lowers the ceiling under the request's own max_tokens, and the turn's
    # model is no longer allowed: the journal's answer still comes back, upstream is not
    # asked; a new request is refused.
    rig.proxy.policy = ProxyPolicy(max_tokens=10)
    rig.proxy.models = frozenset({"another"})
    again = send(rig, body)
    assert again == first
    assert send(rig, case.request("something new", stream=False))[0] == 403
    assert len(upstream_log(rig)) == 1 and len(rig.steps()) == 1


def test_the_budget_counts_every_upstream_attempt_and_ends_the_turn(rig: Rig) -> None:
    case = rig.case
    rig.journal.max_model_calls = 3
    assert send(rig, case.request("one", stream=False))[0] == 200
    # An upstream error leaves the step an intent; asking it again is a second attempt.
    # Before, re-forwards of an interrupted call were not counted at all.
    assert send(rig, case.request("overloaded", stream=False))[0] >= 500
    assert send(rig, case.request("overloaded", stream=False))[0] >= 500
    assert len(upstream_log(rig)) == 3
    status, reply = send(rig, case.request("one past the budget", stream=False))
    assert status == 429 and rig.case.error_shaped(reply), reply
    assert "the turn's limit is 3" in json.dumps(reply)
    assert isinstance(rig.proxy.fatal, TurnFailed)
    # A recorded call still replays (it costs nothing); nothing new went upstream.
    assert send(rig, case.request("one", stream=False))[0] == 200
    assert send(rig, case.request("overloaded", stream=False))[0] == 429
    assert len(upstream_log(rig)) == 3 and len(rig.steps()) == 2


def test_plain_calls_are_checked_and_capped(tmp_path: Path) -> None:
    """count_tokens and the models list are forwarded unjournaled: held to the same
    request policy, and capped per launch (they were unbounded)."""
    with open_rig(tmp_path, WIRES["anthropic"]) as rig:
        rig.proxy.policy = ProxyPolicy(max_plain_calls=3)
        count = "/v1/messages/count_tokens?beta=true"
        body = {
            k: v for k, v in rig.case.request("hi").items() if k not in ("stream", "max_tokens")
        }
        assert send(rig, body, path=count)[0] == 200
        assert send(rig, {**body, "model": "claude-opus-4-1"}, path=count)[0] == 403
        assert send(rig, {**body, "tools": SERVER_TOOLS["anthropic"][:1]}, path=count)[0] == 403
        assert send(rig, method="GET", path="/v1/models/claude-opus-4-1")[0] == 404
        assert send(rig, method="GET", path="/v1/models")[0] == 404  # the fake has no list
        assert send(rig, body, path=count)[0] == 200
        status, reply = send(rig, body, path=count)
        assert status == 429 and "DURABLE_HARNESS_PROXY_MAX_PLAIN_CALLS" in json.dumps(reply)
        assert [r["path"] for r in upstream_log(rig)] == [
            "/v1/messages/count_tokens",
            "/v1/models",
            "/v1/messages/count_tokens",
        ]
        assert rig.steps() == [] and rig.proxy.fatal is None


def test_codex_web_search_is_taken_out_of_what_is_forwarded(tmp_path: Path) -> None:
    """Codex declares a live ``web_search`` tool in every request: the request passes
    without it (upstream gets the request less that tool), under the journal key of what
    Codex sent; enabled by the operator, it goes as sent."""
    with open_rig(tmp_path, WIRES["responses"]) as rig:
        web = {"type": "web_search", "external_web_access": True}
        body = {**rig.case.request("hi", stream=False), "tools": [TOOL["responses"], web]}
        assert send(rig, body)[0] == 200
        without = {**body, "tools": [TOOL["responses"]]}
        expected = rig.fake.answer_responses(json.dumps(without).encode()).request_hash
        assert upstream_log(rig)[-1]["request_hash"] == expected
        assert rig.fake.answer_responses(json.dumps(body).encode()).request_hash != expected
        rig.proxy.policy = ProxyPolicy(server_tools=frozenset({"web_search"}))
        assert send(rig, {**body, "input": rig.case.request("again")["input"]})[0] == 200
        sent = {**body, "input": rig.case.request("again")["input"]}
        assert upstream_log(rig)[-1]["request_hash"] == (
            rig.fake.answer_responses(json.dumps(sent).encode()).request_hash
        )
        assert len(rig.steps()) == 2


def test_a_client_executed_tool_search_passes_as_sent(tmp_path: Path) -> None:
    """codex-acp declares ``tool_search`` with ``"execution": "client"`` (Codex searches
    its own deferred tools): it runs in the agent, not at the provider, so the request is
    journaled and forwarded as it came."""
    with open_rig(tmp_path, WIRES["responses"]) as rig:
        search = {"type": "tool_search", "execution": "client", "parameters": {}}
        body = {**rig.case.request("hi", stream=False), "tools": [TOOL["responses"], search]}
        assert send(rig, body)[0] == 200
        expected = rig.fake.answer_responses(json.dumps(body).encode()).request_hash
        assert upstream_log(rig)[-1]["request_hash"] == expected
        assert len(rig.steps()) == 1


def test_a_launch_takes_only_its_clis_api(tmp_path: Path) -> None:
    """A launch's proxy takes the API its CLI speaks: a valid request of another API
    (same model, same token) is refused, its plain paths too."""
    with open_rig(tmp_path, WIRES["anthropic"]) as rig:
        rig.proxy.wires = frozenset({"/v1/responses"})
        status, reply = send(rig, rig.case.request("hi"))
        assert status == 404 and "does not speak anthropic-messages" in json.dumps(reply)
        body = {k: v for k, v in rig.case.request("hi").items() if k != "max_tokens"}
        assert send(rig, body, path="/v1/messages/count_tokens")[0] == 404
        assert upstream_log(rig) == [] and rig.steps() == []
        rig.proxy.wires = frozenset({"/v1/messages"})
        assert send(rig, rig.case.request("hi"))[0] == 200
