"""Where the adapters find a CLI (adapters/cli/installed.py, host.py): ``$…_BIN``, a
checkout's ``.tools/npm``, the user cache ``setup-agents`` installs into, then ``PATH``;
a binary at another version is refused wherever it was found. And ``run --help`` names
the variable each agent's ``--base-url`` really defaults to.

The binaries here are small shell scripts printing a version: what is checked is the
lookup and the refusal, not the CLIs (test_installed_wheel.py installs the real ones).
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import pytest

from durable_harness.adapters.cli import installed
from durable_harness.adapters.cli.agent import check_version, find_binary
from durable_harness.adapters.cli.host import locate_cli
from durable_harness.adapters.pi.spec import SPEC as PI
from durable_harness.core.errors import ConfigError


def _fake_cli(folder: Path, name: str, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_the_user_cache_after_a_checkout_before_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(PI.bin_env, raising=False)
    monkeypatch.setattr(installed, "CHECKOUT_PREFIX", tmp_path / "checkout")
    on_path = _fake_cli(tmp_path / "bin", "pi", PI.version)
    monkeypatch.setenv("PATH", f"{on_path.parent}:/usr/bin:/bin")
    assert locate_cli("pi", PI.bin_env) == ("PATH", str(on_path))

    prefix = installed.user_prefix()
    assert prefix == tmp_path / "cache/durable-harness/npm" / installed.lock_key()
    cached = _fake_cli(prefix / "node_modules/.bin", "pi", PI.version)
    assert locate_cli("pi", PI.bin_env) == ("user cache", str(cached))
    assert find_binary(PI) == str(cached)

    checkout = _fake_cli(tmp_path / "checkout/node_modules/.bin", "pi", PI.version)
    assert locate_cli("pi", PI.bin_env) == ("checkout", str(checkout))
    override = _fake_cli(tmp_path / "mine", "pi", PI.version)
    monkeypatch.setenv(PI.bin_env, str(override))
    assert locate_cli("pi", PI.bin_env) == (f"${PI.bin_env}", str(override))


def test_a_cached_cli_at_another_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(PI.bin_env, raising=False)
    monkeypatch.setattr(installed, "CHECKOUT_PREFIX", tmp_path / "checkout")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cached = _fake_cli(installed.user_prefix() / "node_modules/.bin", "pi", "0.0.1")
    with pytest.raises(ConfigError) as info:
        check_version(PI, find_binary(PI))
    message = str(info.value)
    assert f"{cached} is Pi 0.0.1" in message and f"exactly {PI.version}" in message
    assert "durable-harness setup-agents" in message


def test_no_cli_anywhere_names_setup_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(PI.bin_env, raising=False)
    monkeypatch.setattr(installed, "CHECKOUT_PREFIX", tmp_path / "checkout")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"run `durable-harness setup-agents`"):
        find_binary(PI)


def test_setup_agents_without_npm_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"node is not on PATH: install Node.js 20\+ and npm"):
        installed.install(lambda _line: None)
    assert not installed.user_prefix().exists()


def test_base_url_help_names_the_variable_each_agent_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durable_harness.adapters import ADAPTERS
    from durable_harness.adapters.acp.preset import AcpPreset, resolve_upstream
    from durable_harness.adapters.cli.spec import CliSpec
    from durable_harness.cli import build_parser
    from durable_harness.harness.endpoint import resolve_endpoint

    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1001")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1002")
    read = {
        "http://127.0.0.1:1001": "ANTHROPIC_BASE_URL",
        "http://127.0.0.1:1002": "OPENAI_BASE_URL",
    }
    parser, _commands = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    (action,) = [a for a in run._actions if "--base-url" in a.option_strings]
    help_text = " ".join(str(action.help).split())
    # Each "env X_BASE_URL for …" up to the next one: the agents it names.
    segments = re.findall(r"env (\w+_BASE_URL) (.*?)(?=env \w+_BASE_URL|; a worker)", help_text)
    named = {env: set(re.findall(r"[\w:-]+", text)) for env, text in segments}
    assert set(named) == {"ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"}, help_text
    for agent, target in ADAPTERS.items():
        if agent == "custom":  # a program's own loop: it has no endpoint of ours
            continue
        module, _, name = target.partition(":")
        found = getattr(importlib.import_module(module), name)
        if isinstance(found, CliSpec):
            upstream = found.upstream
        elif isinstance(found, AcpPreset):
            upstream = functools.partial(resolve_upstream, found.wire)
        else:
            upstream = resolve_endpoint
        env = read[upstream(None)[0]]
        assert agent in named.get(env, set()), (agent, env, help_text)


def test_root_installs_where_the_agent_user_can_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # A root worker runs host-folder agents as the agent user, who cannot enter /root.
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(installed.os, "geteuid", lambda: 0)
    assert installed.user_prefix() == installed.ROOT_PREFIX / installed.lock_key()
    monkeypatch.setattr(installed.os, "geteuid", lambda: 1000)
    assert installed.user_prefix().parts[-3:-1] == ("durable-harness", "npm")
    assert installed.ROOT_PREFIX not in installed.user_prefix().parents


def test_npm_gets_no_secret_of_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_harness.sandbox.docker_image import npm_env

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-for-npm")
    monkeypatch.setenv("DURABLE_HARNESS_WORLD", "postgresql://u:pw@db/x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-npm")
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:4873/")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    env = npm_env()
    assert "sk-not-for-npm" not in env.values() and "not-for-npm" not in env.values()
    assert not any("pw@" in v for v in env.values())
    assert env["npm_config_registry"] == "http://127.0.0.1:4873/"
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and "PATH" in env
