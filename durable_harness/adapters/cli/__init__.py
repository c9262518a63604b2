"""adapters.cli."""
