"""adapters.opencode."""
