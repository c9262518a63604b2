"""Where the pinned agent CLIs live on this machine, and ``setup-agents``, which puts them
there for an installed package (no checkout).

The versions are pinned once, in the lock the package ships beside its Dockerfile
(``sandbox/image/tools/npm/``). Two installs of that lock are looked for, in order:

* ``.tools/npm`` beside a checkout (made by ``scripts/setup``);
* the per-user cache, ``$XDG_CACHE_HOME/durable-harness/npm/<key>`` (default
  ``~/.cache/…``; for root without ``XDG_CACHE_HOME``,
  ``/usr/local/lib/durable-harness/npm/<key>``, which the agent user that runs host-folder
  agents can read), made by :func:`install`; ``<key>`` is a digest of the package.json and
  the lock (the same one ``scripts/setup`` stamps), so a new pin installs beside the old
  one instead of changing CLIs under a running worker.

:func:`~.host.find_cli` tries them after ``$DURABLE_HARNESS_*_BIN`` and before ``PATH``;
whichever is found, the adapter still refuses a binary at another version.

An install runs npm in a private folder of the cache and renames it into place when npm
is done: a killed install leaves no half-made folder that looks complete, and two at once
do not write into one folder. npm reads only the registry it is configured with; nothing
here runs the CLIs besides ``--version``. npm runs with an allow-listed environment
(:func:`~durable_harness.sandbox.docker_image.npm_env`): the packages' install scripts see
no provider key, World URL or cloud credential.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_harness.core.errors import ConfigError
from durable_harness.sandbox.docker_image import IMAGE_DIR, npm_env

__all__ = [
    "CHECKOUT_PREFIX",
    "PINS_DIR",
    "Installed",
    "bin_dirs",
    "install",
    "lock_key",
    "pinned",
    "user_prefix",
]

#: The package.json and lock of the agent CLIs (package data, also the image's).
PINS_DIR = IMAGE_DIR / "tools" / "npm"
#: The checkout this package runs from, if it does (an installed package has none).
_CHECKOUT = Path(__file__).resolve().parents[3]
#: Where scripts/setup installs them beside a checkout.
CHECKOUT_PREFIX = _CHECKOUT / ".tools" / "npm"
#: Seconds one ``npm install`` may take (four CLIs, ~850 MB cold) before it is stopped.
NPM_TIMEOUT = 1200
_MARK = ".durable-harness-installed"


@dataclass(frozen=True)
class Installed:
    """One CLI of the lock: its npm package, the version installed, its binary."""

    package: str
    version: str
    binary: Path


def lock_key() -> str:
    """A digest of the pinned package.json and lock (scripts/setup's stamp, too)."""
    h = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        h.update((PINS_DIR / name).read_bytes())
    return h.hexdigest()[:16]


#: Where root installs them when no XDG_CACHE_HOME is set: a root worker runs host-folder
#: agents as the agent user (sandbox/agent_user.py), who cannot enter /root (0700).
ROOT_PREFIX = Path("/usr/local/lib/durable-harness/npm")


def user_prefix() -> Path:
    """The per-user install of the current lock (it may not exist yet)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base and os.geteuid() == 0:
        return ROOT_PREFIX / lock_key()
    base = base or str(Path.home() / ".cache")
    return Path(base) / "durable-harness" / "npm" / lock_key()


def bin_dirs() -> list[tuple[str, Path]]:
    """``(where, folder)`` of each install of the pinned CLIs to look in, in order."""
    found: list[tuple[str, Path]] = []
    if (_CHECKOUT / "pyproject.toml").is_file():  # not site-packages/.tools of an install
        found.append(("checkout", CHECKOUT_PREFIX / "node_modules" / ".bin"))
    # No HOME to put a cache in (RuntimeError), or no lock shipped: the checkout, PATH.
    with contextlib.suppress(OSError, RuntimeError):
        found.append(("user cache", user_prefix() / "node_modules" / ".bin"))
    return found


def pinned() -> dict[str, str]:
    """npm package -> the exact version the lock pins."""
    data = json.loads((PINS_DIR / "package.json").read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in data["dependencies"].items()}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"setup-agents installs the agent CLIs with npm, and {name} is not on PATH: "
            "install Node.js 20+ and npm (Debian: apt-get install nodejs npm), then run it again"
        )
    return found


def install(say: Callable[[str], None], *, force: bool = False) -> tuple[Path, list[Installed]]:
    """Install the lock's CLIs into :func:`user_prefix` (nothing to do when they are:
    idempotent, unless ``force``); the prefix and what is installed there."""
    target = user_prefix()
    if force or not (target / _MARK).is_file():
        _tool("node")
        npm = _tool("npm")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".partial-{target.name}-"))
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copy2(PINS_DIR / name, partial / name)
            say(f"installing the pinned agent CLIs into {target} (npm install)")
            # `install` with the lock, not `ci`: npm leaves other platforms' optional
            # binaries out of the lock and `ci` then refuses it (scripts/setup says more).
            command = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"]
            try:
                done = subprocess.run(
                    command,
                    cwd=partial,
                    env=npm_env(),  # its packages run install scripts: no key reaches them
                    capture_output=True,
                    text=True,
                    timeout=NPM_TIMEOUT,
                )
            except subprocess.TimeoutExpired:
                raise ConfigError(f"npm install did not finish within {NPM_TIMEOUT} s") from None
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip()[-800:]
                raise ConfigError(f"npm install failed (exit code {done.returncode}): {tail}")
            (partial / _MARK).write_text(lock_key() + "\n")
            partial.chmod(0o755)  # mkdtemp's 0700 would keep the agent user out
            if target.exists():  # --force, or a copy whose mark was lost: replaced whole
                shutil.rmtree(target)
            try:
                partial.rename(target)
            except OSError:
                if not (target / _MARK).is_file():  # else an install beside us finished
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target, _installed(target)


def _installed(prefix: Path) -> list[Installed]:
    rows = []
    for package in pinned():
        meta_file = prefix / "node_modules" / package / "package.json"
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        bins = meta.get("bin") or {}
        names = [package.rsplit("/", 1)[-1]] if isinstance(bins, str) else sorted(bins)
        for name in names:
            rows.append(
                Installed(package, str(meta["version"]), prefix / "node_modules" / ".bin" / name)
            )
    return rows
