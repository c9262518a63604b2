"""Fixtures for the Sandbox contract suite (``test_contract.py``).

Every backend is one entry in :data:`BACKENDS`: how to open a new, empty sandbox of it
(through ``open_sandbox``, as the runtime does) and its :class:`Capabilities`, the ways it
legitimately differs from the others. A test reads a difference from the capabilities and
checks the backend's own behaviour there: nothing is skipped. A backend whose server
cannot be started (Docker) fails the test (``pytest.fail`` in ``docker_host``): never a
skip.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from durable_harness.core.sandbox import Sandbox
from durable_harness.sandbox import open_sandbox

#: Small Docker limits, so that tests running side by side fit the machine.
DOCKER_LIMITS: dict[str, Any] = {"memory": "256m", "pids": 128, "cpus": 1.0, "timeout": 30.0}


@dataclass(frozen=True)
class Capabilities:
    """What a backend does differently, each for a reason of its own."""

    #: False: the shell runs on a pty, which merges stderr into stdout (local).
    separate_stderr: bool
    #: What the shell prints when ``exit`` ends it ("exit\n" from local's interactive bash).
    exit_echo: str
    #: True: one shell lives across commands, so unexported variables carry over too;
    #: False: a fresh bash per command restores only cwd and exported variables (docker).
    persistent_shell: bool
    #: True: a timed-out command's output so far is returned; False: it is dropped with
    #: the command (virtual).
    partial_output_on_timeout: bool
    #: False: a bash-compatible interpreter with no host programs (virtual).
    real_binaries: bool
    #: ``export_state``/``import_state`` work (the backend is journaled or snapshots).
    exports_state: bool
    #: ``open_sandbox`` options capping the workspace at 1,000 bytes; None: no caps.
    byte_cap: dict[str, Any] | None
    #: True: a state's cwd is relative to the workspace (local: a host folder's path
    #: differs between machines); False: an absolute path under the fixed root.
    relative_cwd: bool = False


CAPABILITIES: dict[str, Capabilities] = {
    "virtual": Capabilities(
        separate_stderr=True,
        exit_echo="",
        persistent_shell=True,
        partial_output_on_timeout=False,
        real_binaries=False,
        exports_state=True,
        byte_cap={"max_bytes": 1000},
    ),
    "local": Capabilities(
        separate_stderr=False,
        exit_echo="exit\n",
        persistent_shell=True,
        partial_output_on_timeout=True,
        real_binaries=True,
        exports_state=True,
        byte_cap={"max_snapshot_bytes": 1000},
        relative_cwd=True,
    ),
    "docker": Capabilities(
        separate_stderr=True,
        exit_echo="",
        persistent_shell=False,
        partial_output_on_timeout=True,
        real_binaries=True,
        exports_state=True,
        byte_cap={"max_snapshot_bytes": 1000},
    ),
}


@dataclass
class SandboxSpec:
    """How to open sandboxes of one backend; each :meth:`open` is a new, empty workspace,
    closed (and its container removed) at teardown."""

    name: str
    caps: Capabilities
    opener: Callable[..., Sandbox]
    root_of: Callable[[Sandbox], str]
    opened: list[Sandbox] = field(default_factory=list)

    def open(self, **options: Any) -> Sandbox:
        box = self.opener(**options)
        self.opened.append(box)
        return box

    def root(self, box: Sandbox) -> str:
        """The workspace root as the shell sees it (absolute paths under it are files)."""
        return self.root_of(box)

    def state_cwd(self, box: Sandbox, rel: str) -> str:
        """How an exported state names the folder ``rel`` of ``box`` as its cwd."""
        if self.caps.relative_cwd:
            return rel
        return f"{self.root(box)}/{rel}" if rel else self.root(box)

    def close_all(self) -> None:
        for box in reversed(self.opened):
            remove = getattr(box, "remove", None)  # docker: the session's container
            try:
                if remove is not None:
                    remove()
            finally:
                box.close()


def virtual_backend(request: pytest.FixtureRequest, tmp_path: Path) -> SandboxSpec:
    return SandboxSpec(
        "virtual",
        CAPABILITIES["virtual"],
        lambda **options: open_sandbox("virtual", **options),
        lambda box: "/workspace",
    )


def local_backend(request: pytest.FixtureRequest, tmp_path: Path) -> SandboxSpec:
    folders = (tmp_path / f"ws{n}" for n in itertools.count())
    return SandboxSpec(
        "local",
        CAPABILITIES["local"],
        lambda **options: open_sandbox(str(next(folders)), **{"timeout": 20, **options}),
        lambda box: str(box.root),  # type: ignore[attr-defined]
    )


def docker_backend(request: pytest.FixtureRequest, tmp_path: Path) -> SandboxSpec:
    request.getfixturevalue("docker_host")  # fails the test if dockerd cannot start

    def open_(**options: Any) -> Sandbox:
        session = f"test-{uuid.uuid4().hex[:12]}"
        return open_sandbox("docker", session_id=session, **{**DOCKER_LIMITS, **options})

    return SandboxSpec(
        "docker",
        CAPABILITIES["docker"],
        open_,
        lambda box: "/workspace",
    )


# name -> factory. Adding a backend is one entry here.
BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], SandboxSpec]] = {
    "virtual": virtual_backend,
    "local": local_backend,
    "docker": docker_backend,
}
EXPORTING = [name for name, caps in CAPABILITIES.items() if caps.exports_state]
CAPPED = [name for name, caps in CAPABILITIES.items() if caps.byte_cap is not None]


def _spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxSpec]:
    spec = BACKENDS[request.param](request, tmp_path)
    try:
        yield spec
    finally:
        spec.close_all()


@pytest.fixture(params=list(BACKENDS))
def sandbox_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxSpec]:
    yield from _spec(request, tmp_path)


@pytest.fixture(params=EXPORTING)
def exporting_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxSpec]:
    """The backends that export and import their state (the others: one contract test
    checks that they refuse to)."""
    yield from _spec(request, tmp_path)


@pytest.fixture(params=CAPPED)
def capped_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxSpec]:
    """The backends with a size cap (the others: one contract test checks they take none)."""
    yield from _spec(request, tmp_path)


@pytest.fixture
def sandbox(sandbox_spec: SandboxSpec) -> Sandbox:
    return sandbox_spec.open()
