"""worlds.

Backends are chosen by name or URL with :func:`open_world` and imported lazily, so a heavy
driver (psycopg, boto3) is loaded only by the process that asks for its World.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from durable_harness.core.errors import ConfigError
from durable_harness.core.world import World

KNOWN_WORLDS = ("local", "postgres", "s3sqs")
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
    ``data_dir`` and ``max_attempts``).
    """
    backend, options = _resolve(name, dict(options))
    if backend == "local":
        return _open_local(options)
    if backend == "s3sqs":
        return _open_s3sqs(options)
    if backend == "postgres":
        return _open_postgres(options)
    raise ConfigError(
        f"the {backend} World is not available yet in this version of durable-harness; "
        "use the local World (a folder) for now"
    )


def _resolve(name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if name in KNOWN_WORLDS:
        return name, options
    if "://" in name:
        url = urlparse(name)
        backend = _SCHEMES.get(url.scheme.lower())
        if backend is None:
            raise ConfigError(
                f"unknown World URL scheme {url.scheme!r} in {name!r}; use one of "
                "postgresql://, s3sqs://, local:///path (or file:///path)"
            )
        if backend == "local":
            if url.netloc not in ("", "localhost") or not url.path.strip("/"):
                raise ConfigError(
                    f"{name!r}: a {url.scheme}:// World is a folder on this machine: write "
                    f"{url.scheme}:///absolute/path (three slashes) or a plain path"
                )
            return "local", _with_data_dir(options, unquote(url.path), name)
        options["url"] = name
        return backend, options
    if "/" in name or "\\" in name or name.startswith((".", "~")):
        return "local", _with_data_dir(options, name, name)
    raise ConfigError(
        f"unknown World {name!r}; known Worlds: {', '.join(KNOWN_WORLDS)} "
        "(or a URL: postgresql://..., s3sqs://..., local:///path, or a folder path)"
    )


def _with_data_dir(options: dict[str, Any], path: str, given: str) -> dict[str, Any]:
    if "data_dir" in options and Path(options["data_dir"]) != Path(path):
        raise ConfigError(
            f"World {given!r} names a folder, but data_dir says {options['data_dir']}"
        )
    options["data_dir"] = path
    return options


def _open_local(options: dict[str, Any]) -> World:
    from durable_harness.worlds.local import LocalWorld

    if "data_dir" not in options:
        raise ConfigError("the local World needs a folder: pass data_dir (or a path as the World)")
    data_dir = options.pop("data_dir")
    max_attempts = int(options.pop("max_attempts", 5))
    if options:
        raise ConfigError(f"unknown option(s) for the local World: {', '.join(sorted(options))}")
    return LocalWorld(data_dir, max_attempts=max_attempts)


def _open_s3sqs(options: dict[str, Any]) -> World:
    """``bucket`` and ``queue_url`` (or a URL ``s3sqs://BUCKET[/PREFIX]?queue=QUEUE_URL``),
    ``max_attempts``, ``prefix`` (a key prefix, to share a bucket)."""
    url = options.pop("url", None)
    if url is not None:
        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        options.setdefault("bucket", parsed.netloc or None)
        options.setdefault("prefix", unquote(parsed.path).strip("/"))
        if "queue" in query:
            options.setdefault("queue_url", query["queue"][0])
    bucket, queue_url = options.pop("bucket", None), options.pop("queue_url", None)
    if not bucket:
        raise ConfigError("the s3sqs World needs a bucket: set DURABLE_HARNESS_S3_BUCKET")
    if not queue_url:
        raise ConfigError("the s3sqs World needs a queue: set DURABLE_HARNESS_SQS_QUEUE_URL")
    max_attempts = int(options.pop("max_attempts", 5))
    prefix = str(options.pop("prefix", "") or "")
    if options:
        raise ConfigError(f"unknown option(s) for the s3sqs World: {', '.join(sorted(options))}")
    try:
        from durable_harness.worlds.s3sqs import S3SqsWorld
    except ImportError as exc:
        raise ConfigError(
            f"the s3sqs World needs boto3 ({exc}): pip install 'durable-harness[s3sqs]'"
        ) from exc
    return S3SqsWorld(str(bucket), str(queue_url), max_attempts=max_attempts, prefix=prefix)


def _open_postgres(options: dict[str, Any]) -> World:
    """``url`` (``postgresql://USER:PASSWORD@HOST:5432/DBNAME``) and ``max_attempts``."""
    url = options.pop("url", None)
    if not url:
        raise ConfigError(
            "the postgres World needs a database URL: set DURABLE_HARNESS_POSTGRES_URL="
            "postgresql://USER:PASSWORD@HOST:5432/DBNAME"
        )
    max_attempts = int(options.pop("max_attempts", 5))
    if options:
        raise ConfigError(f"unknown option(s) for the postgres World: {', '.join(sorted(options))}")
    try:
        from durable_harness.worlds.postgres import PostgresWorld
    except ImportError as exc:
        raise ConfigError(
            f"the postgres World needs psycopg ({exc}): pip install 'durable-harness[postgres]'"
        ) from exc
    return PostgresWorld(str(url), max_attempts=max_attempts)
