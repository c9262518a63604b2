"""``acp:codex``: Codex through Zed's ACP agent ``codex-acp``.

``@zed-industries/codex-acp`` 0.16.0 (pinned in tools/npm) is a native binary that embeds
the Codex core (0.137.0, not the pinned ``@openai/codex`` CLI). It runs its own shell
and patch tools and never uses the client's ``fs/*`` or ``terminal/*``; with
``approval_policy = "untrusted"`` it asks ``session/request_permission`` before each
command (with ``never`` it asks nothing, and the harness would see a command only once it
ran), so that request is where the harness journals it.

The model endpoint is its config file, ``$CODEX_HOME/config.toml`` in the launch's HOME:
a Responses-API provider whose ``base_url`` is the proxy and whose key is the per-launch
token, read from the variable the config names. The model must be one Codex knows:
for another name it starts every answer with a "model metadata not found" notice. Its
session record is the rollout file and state database under ``$CODEX_HOME``; it
advertises ``loadSession``.
"""

from __future__ import annotations

import json
import os

from durable_harness.adapters.acp.preset import AcpHome, AcpPreset
from durable_harness.adapters.proxy.canonical_codex import CodexCanonicalizer

__all__ = ["PRESET"]

VERSION = "0.16.0"
_PROVIDER = "durable-harness"
_KEY_ENV = "DURABLE_HARNESS_PROXY_TOKEN"
_CODEX_HOME = ".codex"
RETRIES_ENV = "DURABLE_HARNESS_CODEX_MAX_RETRIES"
DEFAULT_RETRIES = 2


def _retries() -> int:
    """``DURABLE_HARNESS_CODEX_MAX_RETRIES`` (as for the codex adapter), 2 by default."""
    raw = os.environ.get(RETRIES_ENV, "")
    return int(raw) if raw.isdigit() else DEFAULT_RETRIES


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _home(launch: AcpHome) -> tuple[dict[str, bytes], dict[str, str]]:
    config = "\n".join(
        [
            f"model = {_toml(launch.model)}",
            f"model_provider = {_toml(_PROVIDER)}",
            # Asks before every command that is not known-safe: the pre-tool hook.
            'approval_policy = "untrusted"',
            # The sandbox is the harness's (the container): Codex's own would need
            # privileges the container does not give.
            'sandbox_mode = "danger-full-access"',
            f"[model_providers.{_PROVIDER}]",
            f"name = {_toml(_PROVIDER)}",
            f"base_url = {_toml(launch.endpoint + '/v1')}",
            'wire_api = "responses"',
            f"env_key = {_toml(_KEY_ENV)}",
            # Codex retries a failed model call itself; the harness retries the turn.
            f"request_max_retries = {_retries()}",
            f"stream_max_retries = {_retries()}",
            "",
        ]
    )
    env = {
        "CODEX_HOME": f"{launch.home}/{_CODEX_HOME}",
        _KEY_ENV: launch.token,
        "TERM": "dumb",
    }
    return {f"{_CODEX_HOME}/config.toml": config.encode()}, env


PRESET = AcpPreset(
    name="codex",
    product="Codex (ACP)",
    binary="codex-acp",
    package=f"@zed-industries/codex-acp@{VERSION}",
    version=VERSION,
    bin_env="DURABLE_HARNESS_CODEX_ACP_BIN",
    argv=(),
    home=_home,
    docker_only=True,
    wire="responses",
    canonicalizer=lambda launch: CodexCanonicalizer(launch.home),
    record_files=(
        f"{_CODEX_HOME}/sessions/*.jsonl",
        f"{_CODEX_HOME}/state_5.sqlite*",
        f"{_CODEX_HOME}/installation_id",
    ),
    load_session=True,
    # codex-acp has no --version (it refuses the argument).
    version_args=(),
    # A model its Codex core knows (it has no metadata for the codex adapter's default).
    default_model="gpt-5.4",
)
