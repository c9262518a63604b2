"""Building the agent image, listing and removing sandboxes, and the Docker lines of
``durable-harness doctor`` (what ``durable-harness sandbox …`` calls).

The image comes from the ``Dockerfile`` shipped in the package (``image/``, beside this
module; see it and docs/docker.md): a base with Node.js, a non-root user 1000,
``/workspace``, and the agent CLIs at the versions pinned in ``image/tools/npm/
package-lock.json`` (the one place they are pinned). Both ship as package data, so an
installed package builds the image as a checkout does; the folder is laid out as the
build context (``docker build durable_harness/sandbox/image`` works in a checkout).

Two ways to build, one Dockerfile:

* **online** (any Docker with a registry): the base is pulled (``node:20-bookworm-slim``
  unless ``base`` says otherwise) and ``npm ci`` runs inside the build;
* **offline** (no registry, as on CI here): the base is made locally, a Debian
  ``debootstrap --variant=minbase`` root with this host's ``node`` and ``npm`` copied in,
  imported with ``docker import``; the CLIs are installed on the host with ``npm ci``
  and copied in with the build context. Both are cached in ``cache_dir`` (keyed by the
  node version and the lock file), so only the first build pays for them.

The image is tagged ``durable-harness/agent:<package version>`` and labelled with a
digest of its sources, so ``doctor`` can tell a missing image from an outdated one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError, SandboxUnavailable
from durable_harness.core.extras import missing_extra
from durable_harness.core.version import __version__

__all__ = [
    "BuildResult",
    "build_image",
    "context_digest",
    "copy_node",
    "default_image",
    "follow_build",
    "host_node",
    "link_or_copy",
    "npm_env",
]

#: The labels a sandbox's container and volumes are found by (the container is
#: ``durable-harness.session=<id>``, every sandbox object ``durable-harness.managed=1``).
LABEL_SESSION = "durable-harness.session"
LABEL_MANAGED = "durable-harness.managed"
IMAGE_REPOSITORY = "durable-harness/agent"
BASE_REPOSITORY = "durable-harness/base"
CONTEXT_LABEL = "durable-harness.context"
#: On a session image (sandbox/session_image.py): the image it was derived from.
SOURCE_LABEL = "durable-harness.source-image"
#: The image's sources, by their names in the build context (and in :data:`IMAGE_DIR`):
#: the digest hashes these names, so it is the same from a checkout or a wheel.
CONTEXT_FILES = ("Dockerfile", "tools/npm/package.json", "tools/npm/package-lock.json")
#: Where they ship: package data, in a checkout and in an installed package alike.
IMAGE_DIR = Path(__file__).resolve().parent / "image"
BASE_PACKAGES = "ca-certificates,git,procps"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Say = Callable[[str], None]


def default_image() -> str:
    return f"{IMAGE_REPOSITORY}:{__version__}"


def default_cache_dir() -> Path:
    """``DURABLE_HARNESS_DOCKER_CACHE_DIR``, else ``~/.cache/durable-harness/docker``: the
    debootstrap roots and the CLIs' node_modules of offline and session-image builds."""
    if os.environ.get("DURABLE_HARNESS_DOCKER_CACHE_DIR"):
        return Path(os.environ["DURABLE_HARNESS_DOCKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "durable-harness" / "docker"


def source_root() -> Path:
    """The folder that holds the Dockerfile and the pinned CLI versions (package data)."""
    root = IMAGE_DIR
    missing = [f for f in CONTEXT_FILES if not (root / f).is_file()]
    if missing:
        raise ConfigError(
            f"building the agent image needs the package's image sources ({', '.join(missing)}"
            f" not found under {root}): reinstall durable-harness (its wheel ships them)"
        )
    return root


def context_digest(root: Path | None = None) -> str:
    """A digest of everything the image is built from (not of the base or the host)."""
    root = root or source_root()
    h = hashlib.sha256()
    for name in CONTEXT_FILES:
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def connect(docker_host: str | None = None) -> Any:
    """A docker client that answered a ping; SandboxUnavailable otherwise (ConfigError
    naming the extra when the docker package is not installed)."""
    try:
        import docker
        import requests
    except ImportError as exc:
        raise missing_extra("the Docker sandbox", "docker", exc) from exc

    where = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = (
            docker.DockerClient(base_url=docker_host, timeout=600)
            if docker_host
            else docker.from_env(timeout=600)
        )
        client.ping()
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        raise SandboxUnavailable(
            f"Docker is not reachable at {where} ({reason(exc)}): start the Docker daemon "
            "or point DOCKER_HOST at it"
        ) from exc
    return client


@dataclass(frozen=True)
class BuildResult:
    image: str
    seconds: float
    size: int
    cached: bool


def reason(exc: BaseException) -> str:
    """The innermost OS-level reason of a connection failure, for a one-line message."""
    seen: BaseException | None = exc
    found = ""
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            found = seen.strerror
        for arg in getattr(seen, "args", ()):
            if isinstance(arg, OSError) and arg.strerror:
                found = arg.strerror
        seen = seen.__cause__ or seen.__context__
    return found or type(exc).__name__


def _run(command: list[str], say: Say, **kwargs: Any) -> None:
    say("$ " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise ConfigError(
            f"{command[0]} failed (exit code {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-800:]}"
        )


#: What of the worker's environment npm gets when it installs the pinned CLIs (their
#: packages run install scripts): where it runs, its own settings, the way out through a
#: proxy; never a provider key, a World's URL with its password, or cloud credentials.
_NPM_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SHELL")
_NPM_ENV_PREFIXES = ("npm_config_", "NPM_CONFIG_")
_NPM_ENV_NETWORK = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip


def npm_env() -> dict[str, str]:
    """The allow-listed environment every ``npm install`` of the pinned CLIs runs with."""
    return {
        k: v
        for k, v in os.environ.items()
        if k in _NPM_ENV or k in _NPM_ENV_NETWORK or k.startswith(_NPM_ENV_PREFIXES)
    }


def host_node() -> tuple[Path, str]:
    node = shutil.which("node")
    if node is None:
        raise ConfigError("an offline build copies this host's node: install Node.js (20+)")
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(node).resolve(), version.lstrip("v")


def _npm_package() -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError("an offline build installs the CLIs with this host's npm: install npm")
    root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, check=True)
    return Path(root.stdout.strip()) / "npm"


def local_base(client: Any, cache_dir: Path, say: Say, mirror: str = DEBIAN_MIRROR) -> str:
    """The offline base image (built and cached on first use); returns its tag."""
    node, version = host_node()
    return debootstrap_image(
        client,
        cache_dir,
        say,
        repository=BASE_REPOSITORY,
        packages=BASE_PACKAGES,
        node=(node, version),
        mirror=mirror,
    )


def debootstrap_image(
    client: Any,
    cache_dir: Path,
    say: Say,
    *,
    repository: str,
    packages: str,
    node: tuple[Path, str] | None = None,
    mirror: str = DEBIAN_MIRROR,
) -> str:
    """A Debian bookworm ``minbase`` root with ``packages`` (and this host's node, if
    given), imported with ``docker import``: made once, its tar cached in ``cache_dir``
    by a key of what went in; returns its tag. Needs root and debootstrap."""
    version = node[1] if node else ""
    key = hashlib.sha256(f"bookworm|{packages}|{version}".encode()).hexdigest()[:12]
    flavour = f"bookworm-node{version}" if node else "bookworm"
    tag = f"{repository}:{flavour}-{key}"
    import docker.errors

    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    prefix = "base" if node else repository.rsplit("/", 1)[-1]
    tarball = cache_dir / f"{prefix}-{key}.tar"
    if not tarball.is_file():
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            raise ConfigError(
                "the offline base is made with debootstrap, as root: install debootstrap "
                "(apt-get install debootstrap) and run as root, or build online with --base"
            )
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={packages}",
                    *("bookworm", str(rootfs), mirror),
                ],
                say,
            )
            if node:
                copy_node(rootfs, node[0])
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (rootfs / leftover).glob("*"):
                    if item.is_file():
                        item.unlink()
            # A private name, so that two builds at once do not write into one file.
            partial = tarball.with_name(f"{tarball.name}.{os.getpid()}.partial")
            _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], say)
            partial.replace(tarball)
    say(f"importing {tarball} as {tag}")
    client.api.import_image_from_file(
        str(tarball),
        repository=tag.split(":")[0],
        tag=tag.split(":")[1],
        changes=[f"ENV PATH={PATH}", 'CMD ["bash"]'],
    )
    return tag


def copy_node(rootfs: Path, node: Path) -> None:
    """This host's node and npm into the root (same glibc family: Debian 12)."""
    bin_dir = rootfs / "usr/local/bin"
    lib_dir = rootfs / "usr/local/lib/node_modules"
    bin_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(node, bin_dir / "node")
    shutil.copytree(_npm_package(), lib_dir / "npm", symlinks=True)
    for tool in ("npm", "npx"):
        (bin_dir / tool).symlink_to(f"../lib/node_modules/npm/bin/{tool}-cli.js")


def prebuilt_clis(root: Path, cache_dir: Path, say: Say) -> Path:
    """``tools/npm`` with ``node_modules`` installed by this host's npm (cached)."""
    _node_path, version = host_node()
    h = hashlib.sha256(version.encode())
    for name in ("package.json", "package-lock.json"):
        h.update((root / "tools/npm" / name).read_bytes())
    target = cache_dir / f"agent-clis-{h.hexdigest()[:12]}"
    if (target / ".complete").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=cache_dir, prefix="partial-clis-"))
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(root / "tools/npm" / name, partial / name)
    npm = shutil.which("npm") or "npm"
    # `install`, not `ci`: the lock lacks other platforms' optional binaries (scripts/setup).
    _run(
        [npm, "install", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
        say,
        cwd=partial,
        env=npm_env(),
    )
    (partial / ".complete").write_text("")
    if not (target / ".complete").is_file():  # else a build running beside us made it
        shutil.rmtree(target, ignore_errors=True)
        try:
            partial.rename(target)
            return target
        except OSError:
            if not (target / ".complete").is_file():
                raise
    shutil.rmtree(partial, ignore_errors=True)
    return target


def build_image(
    *,
    tag: str | None = None,
    base: str | None = None,
    offline: bool = False,
    network: str | None = None,
    cache_dir: Path | None = None,
    docker_host: str | None = None,
    force: bool = False,
    say: Say = print,
) -> BuildResult:
    """Build the agent image (see the module docstring); a build from unchanged sources
    is skipped unless ``force``. ConfigError if the build fails."""
    started = time.monotonic()
    tag = tag or default_image()
    root = source_root()
    digest = context_digest(root)
    client = connect(docker_host)  # first: it names the extra when docker is missing
    import docker.errors

    cache_dir = cache_dir or default_cache_dir()
    try:
        if not force:
            try:
                image = client.images.get(tag)
                if image.labels.get(CONTEXT_LABEL) == digest:
                    return BuildResult(tag, time.monotonic() - started, image.attrs["Size"], True)
            except docker.errors.ImageNotFound:
                pass
        if offline:
            cache_dir.mkdir(parents=True, exist_ok=True)
            if base is None:
                base = local_base(client, cache_dir, say)
        with tempfile.TemporaryDirectory(dir=cache_dir if offline else None) as tmp:
            context = Path(tmp)
            for name in CONTEXT_FILES:
                (context / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, context / name)
            if offline:
                clis = prebuilt_clis(root, cache_dir, say)
                shutil.copytree(
                    clis / "node_modules",
                    context / "tools/npm/node_modules",
                    symlinks=True,
                    copy_function=link_or_copy,
                )
            _docker_build(client, context, tag, base, network, digest, say)
        size = int(client.images.get(tag).attrs["Size"])
    except docker.errors.DockerException as exc:
        raise ConfigError(f"building {tag} failed: {exc}") from exc
    finally:
        client.close()
    return BuildResult(tag, time.monotonic() - started, size, False)


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the CLIs are ~800 MB: do not copy them into every context
    except OSError:
        shutil.copy2(src, dst)


def _docker_build(
    client: Any,
    context: Path,
    tag: str,
    base: str | None,
    network: str | None,
    digest: str,
    say: Say,
) -> None:
    stream = client.api.build(
        path=str(context),
        tag=tag,
        buildargs={"BASE": base} if base else None,
        labels={CONTEXT_LABEL: digest},
        network_mode=network,
        rm=True,
        forcerm=True,
        decode=True,
    )
    follow_build(stream, say, lambda error: f"building {tag} failed: {error.strip()}")


def follow_build(
    stream: Iterable[dict[str, Any]],
    say: Say,
    failed: Callable[[str], str],
    overdue: Callable[[], str | None] = lambda: None,
) -> None:
    """Read a build's decoded event stream to its end, saying its output lines:
    ConfigError with ``failed(error)`` for the daemon's error, or with ``overdue()``'s
    message as soon as it gives one (leaving the stream closes the connection, which
    stops the build)."""
    for event in stream:
        if "error" in event:
            raise ConfigError(failed(str(event["error"])))
        line = str(event.get("stream", "")).rstrip()
        if line:
            say(line)
        late = overdue()
        if late is not None:
            raise ConfigError(late)
