"""Host git, hardened: the one way the harness runs ``git``.

Two kinds of call:

* on a repository the harness made itself (a temporary clone, a bare repository that
  objects from a snapshot or a bundle were copied into): ``user_config=False`` runs git
  with no system or global config at all, so nothing of the worker's setup (or of a
  repository's own ``.git/config``, which such a repository does not have) changes what
  it does;
* reaching the user's remote or folder (clone, fetch, push): ``user_config=True`` keeps
  the worker's own git config and credential helpers, which is where the operator's
  credentials live. They are used by the host process only and never copied anywhere.

Always: hooks off (``core.hooksPath=/dev/null``), no fsmonitor, the ``ext::`` transport
refused, no terminal prompt, a timeout. A failure is :class:`RepositoryError` with git's
own last line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from durable_harness.core.errors import RepositoryError

__all__ = ["redact_url", "run_git"]

_HARDENING = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "protocol.ext.allow=never",
    "-c",
    "advice.detachedHead=false",
)
#: What a call that reaches the user's remote keeps of the worker's environment.
_CREDENTIAL_ENV = ("HOME", "SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "GIT_ASKPASS", "XDG_CONFIG_HOME")


def run_git(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    user_config: bool = False,
    timeout: float = 300.0,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    error_lines: int = 1,
) -> bytes:
    """Run ``git ARGS`` (see the module docstring) and return its stdout.

    A failure's message keeps git's last ``error_lines`` lines of stderr (a push's reason
    is a few lines above its last one).

    ``cwd`` should be a repository the harness made, or (``user_config``) the user's.
    Repository discovery never climbs above ``cwd``'s parent, so a folder that is not a
    repository is an error rather than some enclosing one."""
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PROTOCOL_FROM_USER": "0",
    }
    if user_config:
        environment.update({k: os.environ[k] for k in _CREDENTIAL_ENV if k in os.environ})
    else:
        environment.update(
            {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": os.devnull}
        )
    if cwd is not None:
        if not Path(cwd).is_dir():
            raise RepositoryError(f"{os.fspath(cwd)} is not a folder")
        environment["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    environment.update(env or {})
    command = ["git", *_HARDENING, *args]
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=environment,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RepositoryError(f"git {args[0]}: gave no answer in {timeout:g}s") from None
    except FileNotFoundError:
        raise RepositoryError(
            "git is not installed on this machine (apt-get install git)"
        ) from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        last = (
            "\n".join(ln.strip() for ln in lines[-error_lines:])
            if lines
            else f"exit code {done.returncode}"
        )
        raise RepositoryError(f"git {args[0]}: {last}")
    return done.stdout


def redact_url(url: str) -> str:
    """``url`` without credentials: the user part of an ``http(s)`` URL (a token is often
    put there) and the password of any other, so it can be shown, stored and logged.
    Paths and ``user@host:path`` remotes are returned as they are (no secret in them)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc or "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = host if parts.scheme in ("http", "https") else f"{user}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))
