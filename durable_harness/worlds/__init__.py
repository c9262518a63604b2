"""worlds."""
