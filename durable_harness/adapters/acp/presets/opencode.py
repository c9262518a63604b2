"""``acp:opencode``: OpenCode (``opencode-ai``, pinned in tools/npm) as ``opencode acp``.

Its model endpoint is its config file (``$XDG_CONFIG_HOME/opencode/opencode.json`` in the
launch's HOME): the bundled ``@ai-sdk/anthropic`` provider pointed at the proxy with the
per-launch token as its key. Its permissions are ``ask`` for the tools that change
something (bash, edit, webfetch), so each of those arrives at the harness as a
``session/request_permission`` (the pre-tool hook), and paths outside the workspace are
denied. No project config, no auto-update, no models.dev fetch, no sharing. Its session
record is its SQLite database under ``XDG_DATA_HOME``.
"""

from __future__ import annotations

import json

from durable_harness.adapters.acp.preset import AcpHome, AcpPreset
from durable_harness.adapters.proxy.canonical_opencode import OpenCodeCanonicalizer

__all__ = ["PRESET"]

VERSION = "1.18.33"
_PROVIDER = "durable-harness"
#: The same switches the opencode adapter sets (no update, no fetch, no project config).
_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "TERM": "dumb",
}


def _home(launch: AcpHome) -> tuple[dict[str, bytes], dict[str, str]]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            _PROVIDER: {
                "npm": "@ai-sdk/anthropic",  # bundled in the binary: nothing is fetched
                "name": "durable-harness",
                "options": {"baseURL": f"{launch.endpoint}/v1", "apiKey": launch.token},
                "models": {launch.model: {"name": launch.model}},
            }
        },
        "model": f"{_PROVIDER}/{launch.model}",
        "small_model": f"{_PROVIDER}/{launch.model}",
        # "ask" reaches the harness as session/request_permission: the pre-tool hook.
        "permission": {
            "bash": "ask",
            "edit": "ask",
            "webfetch": "ask",
            "durable-harness_*": "ask",  # host tools: the request gives the MCP call its id
            "external_directory": "deny",
        },
        # A rejected request (a call that already ran, or possibly ran) must not end the
        # prompt: the model gets the tool's error and goes on (a replay's requests then
        # match the recorded ones: a recorded call's result is keyed by reference).
        "experimental": {"continue_loop_on_deny": True},
        "autoupdate": False,
        "share": "disabled",
    }
    # OpenCode installs @opencode-ai/plugin into its config folder unless a lock lists
    # it; offline that waits ~70 s and fails (see adapters/opencode/home.py).
    dependency = {"@opencode-ai/plugin": VERSION}
    folder = ".config/opencode"
    files = {
        f"{folder}/opencode.json": json.dumps(config, indent=1).encode(),
        f"{folder}/node_modules/.keep": b"",
        f"{folder}/package.json": json.dumps({"dependencies": dependency}).encode(),
        f"{folder}/package-lock.json": json.dumps(
            {"packages": {"": {"dependencies": dependency}}}
        ).encode(),
    }
    return files, dict(_ENV)


PRESET = AcpPreset(
    name="opencode",
    product="OpenCode",
    binary="opencode",
    package=f"opencode-ai@{VERSION}",
    version=VERSION,
    bin_env="DURABLE_HARNESS_OPENCODE_BIN",
    argv=("acp",),
    home=_home,
    wire="anthropic",
    # The opencode adapter's rules: the date, the git line and the HOME path of the <env>
    # block vary between launches (a resume, a replay) without changing the question.
    canonicalizer=lambda launch: OpenCodeCanonicalizer(home=launch.home),
    # The database and its write-ahead log (the newest writes are there until a checkpoint).
    record_files=(".local/share/opencode/opencode.db", ".local/share/opencode/opencode.db-wal"),
    load_session=True,
    host_tool_prefix="durable-harness_",
    safe_tools=frozenset({"read", "glob", "grep", "list", "webfetch", "todowrite", "todoread"}),
)
