"""One PostgreSQL, one dockerd, one moto and one SeaweedFS for a whole pytest-xdist run.

Without this, each pytest process (``scripts/test`` runs 3) starts servers of its own: three
dockerds (two of them on temporary data-roots, as the cached one is locked), three
clusters, three of each S3/SQS server. Instead the controller process starts one of each
before the workers exist (``pytest_configure`` in tests/conftest.py) and passes where they
are in environment variables (each module's ``RUN_ENV``), which the workers inherit; their
accessors (``shared_server()``, ``moto()``, ``seaweedfs()``) then attach instead of
starting, and never stop them. The controller stops them by PID when the run ends.

They are started from the main thread on purpose: ``die_with_parent`` ties each server to
the thread that started it (``PR_SET_PDEATHSIG``), so a pool thread's exit would kill it.
A run in one process (``-n 0``, or no xdist) keeps starting them lazily, on first use.
"""

from __future__ import annotations

import os

import docker_server
import postgres_server
import services_s3


def start() -> None:
    """Start the run's servers and export where they are (the controller, once)."""
    postgres = postgres_server.shared_server()
    os.environ[postgres_server.RUN_ENV] = postgres_server.run_description(postgres)
    if docker_server.unavailable() is None:  # else each Docker test fails with the reason
        os.environ[docker_server.RUN_ENV] = docker_server.shared_server().url
    os.environ[services_s3.RUN_ENV["moto"]] = str(services_s3.moto().port)
    os.environ[services_s3.RUN_ENV["seaweedfs"]] = str(services_s3.seaweedfs().port)


def stop() -> None:
    """Stop them by PID (the controller, at the end of the run)."""
    for name in (postgres_server.RUN_ENV, docker_server.RUN_ENV, *services_s3.RUN_ENV.values()):
        os.environ.pop(name, None)
    postgres_server.stop_shared()
    docker_server.stop_shared()
    services_s3.stop_all()
