"""The operator's own ACP agents (``DURABLE_HARNESS_ACP_AGENTS``), with the scripted
agent (tests/fixtures/acp_agent.py) as one: a turn names it and runs (its fs/* and
terminal/* journaled, its agentInfo.version checked), another version is refused before
``session/new``, and what the turn cannot do: name an agent the operator did not
define (``run``, a queued turn claimed by a worker whose operator defined none, the HTTP
API), or carry a command in its agent config."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
from acp_cases import FAKE_AGENT, fake_agent_harness, run_args
from claude_cases import dump
from support import Harness, start_serve

AGENTS = f"""
[acp.agents.scripted]
command = ["{FAKE_AGENT}"]
version = "1.18.33"
env = {{ SCRIPTED_BASE_URL = "{{endpoint}}/v1", SCRIPTED_API_KEY = "{{token}}" }}

[acp.agents.stale]
command = ["{FAKE_AGENT}"]
version = "2.0.0"
"""


def error_of(response: httpx2.Response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


def _turn_id(out_stdout: str) -> str:
    return out_stdout.splitlines()[1].split()[1]


def _nothing_done(h: Harness, turn_id: str) -> dict[str, object]:
    show = h.show(turn_id)
    assert show["turn"]["status"] == "failed", dump(show)
    assert [s for s in show["steps"] if s["status"] == "done"] == [], dump(show)
    return show


def test_operator_agent(tmp_path: Path) -> None:
    agents = tmp_path / "acp-agents.toml"
    agents.write_text(AGENTS)
    for h in fake_agent_harness(tmp_path, "tools"):
        h.env.pop("DURABLE_HARNESS_OPENCODE_BIN")  # acp:opencode is not involved here
        h.env["DURABLE_HARNESS_ACP_AGENTS"] = str(agents)

        out = h.cli(*run_args(h, agent="acp:scripted"))
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout.strip().splitlines()[-1])
        assert reply["read"] == {"content": "HELLO-ACP\n"}
        show = h.show(_turn_id(out.stdout))
        tools = [(s["name"], s["status"]) for s in show["steps"] if s["kind"] == "tool"]
        assert tools[:2] == [("fs/write_text_file", "done"), ("terminal/create", "done")]
        assert (tmp_path / "ws" / "effects.txt").read_text() == "RAN\n"

        # Another version than the operator pinned: one error at initialize, nothing ran.
        out = h.cli(*run_args(h, agent="acp:stale"), timeout=120)
        assert out.returncode != 0
        assert (
            "is the operator's ACP agent 'stale' 1.18.33 (its initialize result's "
            "agentInfo.version), but acp:stale needs exactly 2.0.0"
        ) in out.stderr, out.stderr
        _nothing_done(h, _turn_id(out.stdout))
        assert (tmp_path / "ws" / "effects.txt").read_text() == "RAN\n"

        # A name the operator did not define: refused before anything is recorded.
        out = h.cli(*run_args(h, agent="acp:nope"))
        assert out.returncode == 2, out.stderr
        assert "unknown agent 'acp:nope'" in out.stderr
        assert "operator's ACP agents (DURABLE_HARNESS_ACP_AGENTS): acp:scripted, acp:stale" in (
            out.stderr
        )

        # A turn cannot carry a command (or argv, env) for its agent.
        config = tmp_path / "agent.toml"
        for line in ('command = ["sh", "-c", "id"]', 'argv = ["x"]', "env = { A = '1' }"):
            config.write_text(line + "\n")
            out = h.cli(*run_args(h, "--agent-config", str(config), agent="acp:scripted"))
            assert out.returncode == 2, out.stderr
            assert "Extra inputs are not permitted" in out.stderr, out.stderr

        # Queued by an operator who defined it, claimed by a worker whose operator did
        # not: the worker refuses the name; the turn carried no command to run instead.
        queued = h.cli(*run_args(h, "--detach", agent="acp:scripted"))
        assert queued.returncode == 0, queued.stderr
        turn_id = _turn_id(queued.stdout)
        worker_env = {k: v for k, v in h.env.items() if k != "DURABLE_HARNESS_ACP_AGENTS"}
        h.env, saved = worker_env, h.env
        try:
            worked = h.cli("worker", "--until-idle", timeout=120)
        finally:
            h.env = saved
        assert worked.returncode == 0, worked.stderr
        show = _nothing_done(h, turn_id)
        assert "unknown agent 'acp:scripted'" in json.dumps(show), dump(show)
        assert (tmp_path / "ws" / "effects.txt").read_text() == "RAN\n"


def test_operator_agent_version_is_refused_for_a_preset(tmp_path: Path) -> None:
    """The built-in preset's pin, checked at initialize (the scripted agent stands in for
    acp:opencode and passes its --version check, then reports another version)."""
    for h in fake_agent_harness(tmp_path, "tools", version="1.0.0"):
        out = h.cli(*run_args(h), timeout=120)
        assert out.returncode != 0
        assert (
            "is OpenCode 1.0.0 (its initialize result's agentInfo.version), but acp:opencode "
            "needs exactly 1.18.33"
        ) in out.stderr, out.stderr
        _nothing_done(h, _turn_id(out.stdout))
        assert not (tmp_path / "ws" / "effects.txt").exists()


def test_http_api_names_only_operator_agents(tmp_path: Path) -> None:
    agents = tmp_path / "acp-agents.toml"
    agents.write_text(AGENTS)
    for h in fake_agent_harness(tmp_path, "tools"):
        made = h.cli("token", "create", "--tenant", "acme", "--label", "ci")
        assert made.returncode == 0, made.stderr
        serve = start_serve(
            h,
            DURABLE_HARNESS_ACP_AGENTS=str(agents),
            DOCKER_HOST=f"unix://{tmp_path / 'no-docker.sock'}",  # this serve has no Docker
        )
        try:
            with serve.http(made.stdout.strip()) as api:
                status, code, message = error_of(
                    api.post("/v1/sessions", json={"agent": "acp:nope"})
                )
                assert (status, code) == (422, "unknown_agent"), message
                assert "acp:scripted, acp:stale" in message
                # The operator's agent is one of this server's: refused only further on
                # (its Docker workspace: this serve has no Docker), not as unknown.
                status, code, message = error_of(
                    api.post("/v1/sessions", json={"agent": "acp:scripted"})
                )
                assert code != "unknown_agent" and "Docker" in message, (status, code, message)
        finally:
            serve.stop()
