"""The World the operator's settings name, opened (the runtime wires settings to a backend;
the core settings know no backend: each backend reads its own)."""

from __future__ import annotations

from durable_harness.core.settings import Settings
from durable_harness.core.world import World
from durable_harness.worlds import open_configured


def open_configured_world(settings: Settings) -> World:
    """The World chosen by ``settings.world``, with that backend's settings."""
    return open_configured(settings)
