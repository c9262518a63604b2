"""The World the operator's settings name, opened (the runtime wires settings to a backend;
the settings themselves know no backend module)."""

from __future__ import annotations

from durable_harness.core.settings import Settings
from durable_harness.core.world import World
from durable_harness.worlds import open_world


def open_configured_world(settings: Settings) -> World:
    """The World chosen by ``settings.world``, with that backend's options."""
    return open_world(settings.world, **settings.world_options())
