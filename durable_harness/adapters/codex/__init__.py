"""The codex agent: the real ``codex`` CLI behind the journaling proxy (adapter.py), with
its setup, canonical request form, rollout, MCP host tools and output. Imports
adapters.cli, adapters.proxy and the layers below; no other agent's package."""
