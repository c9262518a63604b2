"""worlds: one module per World backend, chosen by name or URL.

:func:`open_world` picks a backend by name (``local``, ``postgres``, ``s3sqs``) or by a
URL's scheme and imports its module lazily, so a heavy driver (psycopg, boto3) is loaded
only by the process that asks for its World. Each backend's World class owns its options
and settings (:class:`Backend`); this module knows only the backends' names, schemes and
the driver each needs.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol
from urllib.parse import urlparse

from durable_harness.core.errors import ConfigError
from durable_harness.core.extras import missing_extra
from durable_harness.core.settings import Settings, WorldSettings
from durable_harness.core.world import World


class Backend(Protocol):
    """What a backend's World class offers beside the World seam itself."""

    #: Its settings: fields read from ``DURABLE_HARNESS_*`` variables (and flags).
    settings_model: type[WorldSettings]

    def from_options(self, **options: Any) -> World:
        """Open the World from explicit options (``url`` among them when the World was
        named by a URL); :class:`ConfigError` naming a missing or unknown one."""
        ...


#: Backend name -> (module, World class, the driver it needs and its extra).
BACKENDS: dict[str, tuple[str, str, str]] = {
    "local": ("durable_harness.worlds.local", "LocalWorld", ""),
    "postgres": ("durable_harness.worlds.postgres", "PostgresWorld", "psycopg"),
    "s3sqs": ("durable_harness.worlds.s3sqs", "S3SqsWorld", "boto3"),
}
KNOWN_WORLDS = tuple(BACKENDS)
_SCHEMES = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "s3sqs": "s3sqs",
    "file": "local",
    "local": "local",
}


def open_world(name: str, **options: Any) -> World:
    """Open the World called ``name`` (``local``, ``postgres``, ``s3sqs``) or given by a URL.

    A URL picks the backend by scheme: ``postgresql://...``, ``s3sqs://...``,
    ``local:///path`` or ``file:///path`` (a local folder); a plain path (``./state``,
    ``/var/lib/dh``) is a local folder too. ``options`` go to the backend (``local`` takes
    ``data_dir`` and ``max_attempts``). No environment variable is read here: see
    :func:`open_configured`.
    """
    backend, options = _resolve(name, dict(options))
    return backend_class(backend).from_options(**options)


def open_configured(settings: Settings) -> World:
    """Open the World that ``settings.world`` names, as the operator configured it.

    A World named by a URL or a path is opened from it alone; a World named by its
    backend's name takes that backend's settings (its flags, over its ``DURABLE_HARNESS_*``
    variables, over its defaults). ``max_attempts`` comes from ``settings``.
    """
    backend, options = _resolve(settings.world, {"max_attempts": settings.max_attempts})
    cls = backend_class(backend)
    if "url" not in options:
        model = cls.settings_model
        flags = {k: v for k, v in settings.world_flags().items() if k in model.model_fields}
        options = {**model.load(**flags).world_options(), **options}
    return cls.from_options(**options)


def backend_class(backend: str) -> Backend:
    """The World class of ``backend`` (a name from :data:`BACKENDS`), imported now."""
    module_name, class_name, driver = BACKENDS[backend]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if not driver:
            raise
        raise missing_extra(f"the {backend} World ({driver})", backend, exc) from exc
    cls: Backend = getattr(module, class_name)
    return cls


def _resolve(name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The backend ``name`` chooses, and ``options`` with the URL (or path) it gives."""
    if name in BACKENDS:
        return name, options
    if "://" in name:
        scheme = urlparse(name).scheme.lower()
        backend = _SCHEMES.get(scheme)
        if backend is None:
            raise ConfigError(
                f"unknown World URL scheme {scheme!r} in {name!r}; use one of "
                "postgresql://, s3sqs://, local:///path (or file:///path)"
            )
        return backend, {**options, "url": name}
    if "/" in name or "\\" in name or name.startswith((".", "~")):
        return "local", {**options, "url": name}
    raise ConfigError(
        f"unknown World {name!r}; known Worlds: {', '.join(KNOWN_WORLDS)} "
        "(or a URL: postgresql://..., s3sqs://..., local:///path, or a folder path)"
    )
