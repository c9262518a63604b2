"""adapters.proxy.wire."""
