"""The ACP adapter: any agent that speaks the Agent Client Protocol, with the harness as
its client (:mod:`.acp.adapter`), one :class:`~.acp.preset.AcpPreset` per agent
(:mod:`.acp.presets`)."""
