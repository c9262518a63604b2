"""The claude-code agent: the real ``claude`` CLI behind the journaling proxy (adapter.py),
with its setup, canonical request form, transcript reading and output. Imports
adapters.cli, adapters.proxy and the layers below; no other agent's package."""
