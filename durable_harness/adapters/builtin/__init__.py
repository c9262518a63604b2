"""adapters.builtin."""
