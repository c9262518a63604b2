"""Which toolchain image a new session's container runs, when ``run`` is not told.

``run --image IMAGE`` names it. Without ``--image``, a session seeded from a repository
(runtime/seed.py) uses the one the repository declares in its devcontainer.json
(repo/devcontainer.py), read from the checkout of the seeded commit:

====================================  ==============================================
the devcontainer.json has             the turn gets
====================================  ==============================================
``"image": NAME``                     ``image`` NAME, as if ``--image NAME`` was typed
``"build": {dockerfile, context}``    ``image`` the tag built now (sandbox/repo_image.py)
``postCreateCommand`` (and the other  ``setup``, unless ``--setup`` was given
create-time commands)
====================================  ==============================================

Either way the value is put in the turn's config before ``run`` grants it, so it is
allowed exactly as a typed ``--image`` is: in this process; a worker elsewhere only with
its ``DURABLE_HARNESS_ALLOWED_IMAGES``. ``--image PATH`` (an existing Dockerfile, or a
folder holding one) is built the same way, with the file's folder as its context. A root
``Dockerfile`` without a devcontainer is never used by itself (it is usually the
application's production image, not a toolchain): ``run`` says how to use it.

Everything here runs at ``run``, before anything is recorded: a bad devcontainer.json or
a failed build is one ConfigError line and no session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import DOCKER
from durable_harness.repo.devcontainer import CANDIDATES, find_devcontainer
from durable_harness.sandbox.repo_image import build_repo_image

__all__ = ["image_argument", "repository_toolchain"]

Say = Callable[[str], None]


def image_argument(value: str, workspace: str, settings: Settings, say: Say) -> str:
    """The image ``--image VALUE`` names: VALUE itself, or, when VALUE is an existing
    Dockerfile or a folder holding one, the tag of its image built now (its folder is the
    context). A value written as a path (``./…``, ``/…``, ``~/…``) that is neither is
    refused: it is not an image name either."""
    path = Path(value).expanduser()
    dockerfile = path if path.is_file() else path / "Dockerfile"
    if not dockerfile.is_file():
        if value.startswith(("./", "../", "/", "~")):
            raise ConfigError(
                f"--image {value}: no Dockerfile there (give a Dockerfile, a folder holding "
                "one, or an image name)"
            )
        return value
    if workspace != DOCKER:
        return value  # start_turn refuses it, saying to add --workspace docker
    dockerfile = dockerfile.resolve()
    built = build_repo_image(
        dockerfile,
        dockerfile.parent,
        label=value,
        max_bytes=settings.toolchain_context_max_bytes,
        timeout=settings.toolchain_build_timeout,
        network=settings.toolchain_build_network,
        say=say,
    )
    say(f"toolchain: {built.tag}, {'built' if built.built else 'found'} from {value}")
    return built.tag


def repository_toolchain(
    checkout: Path,
    config: dict[str, Any],
    settings: Settings,
    say: Say,
    *,
    source: str,
    setup_given: bool,
    devcontainer: bool = True,
) -> None:
    """Set the turn's ``image`` and ``setup`` in ``config`` from the devcontainer.json of
    ``checkout`` (the seeded commit's clean checkout; see the module docstring), telling
    the user in one line each what was used. ``source`` is the repository as ``run`` was
    given it (for the hint about a root Dockerfile); ``setup_given``: ``--setup`` was
    typed, which wins over the devcontainer's commands; without ``devcontainer``
    (``--no-devcontainer``) only the hint about a root Dockerfile is given."""
    if config.get("workspace") != DOCKER:
        if not devcontainer:
            return
        # Not read at all: only the Docker workspace has a toolchain to choose.
        for name in CANDIDATES:
            if os.path.lexists(checkout / name):
                say(
                    f"the repository's {name} is not used: its toolchain is for the Docker "
                    "workspace (add --workspace docker)"
                )
                break
        return
    found = find_devcontainer(checkout) if devcontainer else None
    if found is None:
        if (checkout / "Dockerfile").is_file():
            say(
                "the repository's Dockerfile is not used as the toolchain (it is usually the "
                f"application's image): give --image {_dockerfile_hint(source)} to build and "
                "use it"
            )
        return
    for key in found.ignored:
        say(f"{found.path}: {key!r} is not supported and left out")
    if found.dockerfile is not None and found.context is not None:
        rel = found.dockerfile.relative_to(checkout.resolve()).as_posix()
        built = build_repo_image(
            found.dockerfile,
            found.context,
            label=rel,
            max_bytes=settings.toolchain_context_max_bytes,
            timeout=settings.toolchain_build_timeout,
            build_args=found.build_args,
            target=found.target,
            network=settings.toolchain_build_network,
            say=say,
        )
        config["image"] = built.tag
        how = "built" if built.built else "found (built before)"
        say(
            f"toolchain: {built.tag}, {how} from {rel} ({found.path}); --image overrides, "
            "--no-devcontainer ignores it"
        )
    elif found.image is not None:
        config["image"] = found.image
        say(
            f"toolchain: the devcontainer's image {found.image} ({found.path}); --image "
            "overrides, --no-devcontainer ignores it"
        )
    else:
        say(f"toolchain: {found.path} names no image or build: the agent image (give --image)")
    if found.setup is not None:
        if setup_given:
            say(f"setup: --setup is used, not the {'/'.join(found.setup_keys)} of {found.path}")
        else:
            config["setup"] = found.setup
            say(
                f"setup: {found.setup!r} ({'/'.join(found.setup_keys)} of {found.path}) runs "
                "before the agent; --setup overrides"
            )


def _dockerfile_hint(source: str) -> str:
    """How the user names the repository's root Dockerfile from the current folder."""
    if "://" in source or (":" in source and not os.path.exists(source)):
        return "PATH/Dockerfile (of a checkout)"
    rel = os.path.relpath(Path(source) / "Dockerfile")
    return rel if rel.startswith((".", "/")) else f"./{rel}"
