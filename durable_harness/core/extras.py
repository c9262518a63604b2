"""The optional extras (``pip install 'durable-harness[EXTRA]'``) and the one line a missing
one gives.

Each extra brings the drivers of one feature, imported only when that feature is used:
``postgres`` (the PostgreSQL World), ``s3sqs`` (the S3+SQS World), ``docker`` (the Docker
sandbox and ``sandbox build``), ``otel`` (OpenTelemetry export); ``all`` is every one of
them. The HTTP API (``serve``), the viewer and the MCP transport are in the base install.
"""

from __future__ import annotations

from durable_harness.core.errors import ConfigError

__all__ = ["EXTRAS", "install_hint", "missing_extra"]

#: Extra -> what it is for (as ``--help`` and the docs name it).
EXTRAS = {
    "postgres": "the PostgreSQL World",
    "s3sqs": "the S3+SQS World",
    "docker": "the Docker sandbox",
    "otel": "OpenTelemetry export",
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'durable-harness[{extra}]'"


def missing_extra(what: str, extra: str, exc: ImportError) -> ConfigError:
    """The error of a feature whose extra is not installed: one line, naming the package
    that failed to import and the ``pip install`` to run."""
    name = exc.name or str(exc)
    return ConfigError(
        f"{what} needs the {extra} extra ({name} is not installed): {install_hint(extra)}"
    )
