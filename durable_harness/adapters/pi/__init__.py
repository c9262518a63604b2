"""adapters.pi."""
