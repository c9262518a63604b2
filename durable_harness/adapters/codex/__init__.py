"""adapters.codex."""
