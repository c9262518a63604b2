"""The ACP agents' presets, one module each (each a ``PRESET``: :class:`~.acp.preset.AcpPreset`)."""
