"""Fixtures for the World contract suite.

Every backend is one entry in :data:`BACKENDS`: a context manager that, given a fresh
temporary folder, yields the ``open_world`` options of a new, empty World (starting a
server or creating a database/bucket if it needs one, and cleaning up afterwards). A
backend whose server cannot be started fails the test (``pytest.fail``): never a skip.

The options must be plain data: the multi-process test hands them to child processes,
which open the same World with ``open_world(name, **options)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import postgres_server
import pytest
import services_s3

from durable_harness.core.world import World
from durable_harness.worlds import open_world


@contextlib.contextmanager
def local_backend(tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield {"data_dir": str(tmp_path / "world")}


@contextlib.contextmanager
def s3sqs_moto_backend(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """S3 and SQS on moto server: a fresh bucket and queue per test."""
    server = services_s3.moto()
    with services_s3.s3sqs_env(server.url, server.url) as options:
        yield options


@contextlib.contextmanager
def s3sqs_seaweedfs_backend(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """S3 on SeaweedFS (a real S3 server), SQS on moto server."""
    with services_s3.s3sqs_env(services_s3.seaweedfs().url, services_s3.moto().url) as options:
        yield options


@contextlib.contextmanager
def postgres_backend(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A new database per test on the run's PostgreSQL server (tests/postgres_server.py)."""
    if postgres_server.find_bindir() is None:
        pytest.fail("PostgreSQL binaries not found: run scripts/setup (it installs them)")
    with postgres_server.fresh_world() as options:
        yield options


# name -> factory. Adding a backend (postgres, s3sqs) is one entry here.
BACKENDS: dict[str, Callable[[Path], contextlib.AbstractContextManager[dict[str, Any]]]] = {
    "local": local_backend,
    "postgres": postgres_backend,
    "s3sqs-moto": s3sqs_moto_backend,
    "s3sqs-seaweedfs": s3sqs_seaweedfs_backend,
}


@dataclass(frozen=True)
class WorldSpec:
    """How to open one test World; ``open`` may be called several times (several clients)."""

    name: str
    options: dict[str, Any]

    def open(self, **overrides: Any) -> World:
        return open_world(self.name, **{**self.options, **overrides})


@pytest.fixture(params=sorted(BACKENDS))
def world_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorldSpec]:
    with BACKENDS[request.param](tmp_path) as options:
        # "s3sqs-moto" is the s3sqs World on moto: the name up to "-" is the World's.
        yield WorldSpec(request.param.split("-", 1)[0], options)


@pytest.fixture
def open_test_world(world_spec: WorldSpec) -> Iterator[Callable[..., World]]:
    """Open (and close at teardown) clients of the test's World, e.g. with ``max_attempts``."""
    opened: list[World] = []

    def open_(**overrides: Any) -> World:
        world = world_spec.open(**overrides)
        opened.append(world)
        return world

    yield open_
    for world in opened:
        world.close()


@pytest.fixture
def world(open_test_world: Callable[..., World]) -> World:
    return open_test_world()
