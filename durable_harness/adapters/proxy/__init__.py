"""adapters.proxy."""
